"""Helpers shared by Crater's tests: real servers, databases and event taps."""
