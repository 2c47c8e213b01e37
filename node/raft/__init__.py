"""The Raft core: pure, deterministic, one instance per group member (see rawnode.py)."""
