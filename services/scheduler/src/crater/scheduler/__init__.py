"""Crater scheduler service."""
