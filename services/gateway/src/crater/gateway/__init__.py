"""Crater gateway service."""
