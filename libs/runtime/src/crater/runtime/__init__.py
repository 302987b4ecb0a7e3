"""Shared service wiring."""
