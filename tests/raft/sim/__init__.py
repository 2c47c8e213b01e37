"""The seeded whole-cluster Raft simulator (see docs/simulator.md)."""
