"""The trace simulator: the production scheduling core replayed on public cluster traces."""
