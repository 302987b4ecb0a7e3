"""Crater callback service."""
