"""The scheduler's edges: its database tables and repository."""
