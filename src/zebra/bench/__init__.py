"""`zebra bench`: measurements whose figures go to docs/benchmarks.md (command, machine, date)."""
