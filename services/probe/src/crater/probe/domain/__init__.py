"""Pure probe logic: topology, fingerprint, health, DOT, simulated dynamics. No I/O, no clock."""
