"""What the probe simulates, beside the real node agent: a fleet of nodes from YAML profiles
(`fleet`, `profiles/`, `fleets/`), their load and faults (`simulation`), and the runner that
plays the tasks placed on them (`runner`). `CRATER_PROBE_MODE=fleet` runs it; the demo, the
benchmarks and the tests use it directly."""
