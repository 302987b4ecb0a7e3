"""Use cases: feed an event to the core and commit what it decided, in one transaction."""
