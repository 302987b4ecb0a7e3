"""Crater autoscaler service."""
