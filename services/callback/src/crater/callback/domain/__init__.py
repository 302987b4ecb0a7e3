"""Pure callback logic: what AllData is told, and when to try again. No I/O, no clock."""
