"""Not part of the callback service: a reference webhook receiver standing in for AllData
(`crater receiver`, the demo, the benchmarks and the tests)."""
