"""The crater command line."""
