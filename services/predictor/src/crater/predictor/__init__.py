"""Crater predictor service."""
