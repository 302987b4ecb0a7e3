"""The callback's edges: its database tables and migrations, the HTTP sender."""
