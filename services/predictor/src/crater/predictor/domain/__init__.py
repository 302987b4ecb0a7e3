"""Pure prediction logic: no I/O, no clock."""
