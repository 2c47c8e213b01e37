"""Client-visible correctness: histories recorded by the simulator are linearizable.

Client-heavy seeds (more clients, fewer keys' worth of contention, partitions and
crashes) whose final check runs the Wing & Gong checker on the whole history,
plus a self-test: a harness that serves reads from local state without a
ReadIndex round must be caught.
"""
from __future__ import annotations

import os
import pytest

from tests.raft.sim import simulator
from tests.raft.sim.network import NetConfig
from tests.raft.sim.seeds import selected_seeds, selected_steps

LIN_SEEDS = 60
LIN_STEPS = 2000
LIN_BASE = 500_000  # distinct from the safety seeds
SOAK_BASE = 5_000_000  # soak seeds never overlap the CI ones (nor the safety soak's)

_SEEDS = selected_seeds(LIN_SEEDS, base=LIN_BASE)


client_heavy = simulator.client_heavy_config


@pytest.mark.parametrize("seed", _SEEDS)
def test_history_is_linearizable(seed):
    steps = selected_steps(LIN_STEPS)
    res = simulator.run(seed, client_heavy(seed, steps), test_file="tests/raft/test_sim_linearizable.py")
    assert res.linearizable is not False  # a False result raises inside run(); None = budget exceeded


def test_histories_are_checked_not_skipped():
    """Most client-heavy runs must produce real histories, and the checker must finish on them."""
    results = [simulator.run(s, client_heavy(s, 800)) for s in range(LIN_BASE, LIN_BASE + 12)]
    completed = sum(r.counts["ok"] + r.counts["read_ok"] for r in results)
    assert completed >= 12 * 5, f"only {completed} completed operations in 12 runs"
    assert sum(r.linearizable is True for r in results) >= 10


def test_stale_local_reads_are_caught():
    """Self-test: reads answered from a node's local state (no ReadIndex) are not linearizable."""
    caught = []
    for seed in range(40):
        cfg = simulator.SimConfig(nodes=3, steps=1500, net=NetConfig(max_delay=3), clients=4,
                                  w_partition=0.03, inject=frozenset({"stale_reads"}))
        try:
            simulator.run(seed, cfg)
        except simulator.SimFailure as e:
            assert "not linearizable" in e.reason, e.reason[:500]
            caught.append(seed)
    assert caught, "stale reads were never detected: the linearizability check proves nothing"


@pytest.mark.soak
def test_soak_many_seeds():
    """Long run: XRAFT_SIM_SEEDS (default 2000) client-heavy seeds of LIN_STEPS; lists every failing seed."""
    count = int(os.environ.get("XRAFT_SIM_SEEDS", 2000))
    failures = simulator.soak_failures(range(SOAK_BASE, SOAK_BASE + count),
                                       lambda s: client_heavy(s, LIN_STEPS), "tests/raft/test_sim_linearizable.py")
    assert not failures, f"{len(failures)} of {count} seeds failed:\n" + "\n".join(failures[:50])
