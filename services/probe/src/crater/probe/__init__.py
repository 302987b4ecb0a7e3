"""Crater probe service."""
