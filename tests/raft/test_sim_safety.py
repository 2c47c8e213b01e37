"""The whole-cluster simulator over many seeds: Raft's safety properties under faults.

Each seed is its own configuration (3 or 5 nodes; its own mix of message loss,
duplication, delay, partitions, pauses, crashes, membership changes, transfers,
compaction and snapshot chunking) and its own schedule. A failure prints the
seed, the configuration, the reproduction command and the last 200 events.

    XRAFT_SIM_SEED=1234 XRAFT_SIM_STEPS=1500 python -m pytest tests/raft/test_sim_safety.py -q
    XRAFT_SIM_SEEDS=20000 python -m pytest tests/raft/test_sim_safety.py -m soak -q
"""
from __future__ import annotations

import os

import pytest

from tests.raft.sim import simulator
from tests.raft.sim.seeds import selected_seeds, selected_steps

CI_SEEDS = 500
CI_STEPS = 1500
SOAK_STEPS = 4000
SOAK_BASE = 1_000_000  # soak seeds never overlap the CI ones

_SEEDS = selected_seeds(CI_SEEDS, base=0)


@pytest.mark.parametrize("seed", _SEEDS)
def test_seed_is_safe_and_settles(seed):
    steps = selected_steps(CI_STEPS)
    cfg = simulator.config_for_seed(seed, steps=steps)
    res = simulator.run(seed, cfg, test_file="tests/raft/test_sim_safety.py")
    # the run did real work: the checker looked at applied entries, the cluster settled
    assert res.steps == steps and res.settle_steps > 0


def test_the_seed_mix_covers_every_fault_and_both_sizes():
    """Swarm testing only helps if the seeds actually reach every fault and cluster size."""
    cfgs = [simulator.config_for_seed(s) for s in range(CI_SEEDS)]
    assert {c.nodes for c in cfgs} == {3, 5}
    for name in ("w_crash", "w_pause", "w_partition", "w_campaign", "w_admin"):
        assert sum(getattr(c, name) > 0 for c in cfgs) > CI_SEEDS // 10, name
    assert sum(c.net.drop_rate > 0 for c in cfgs) > CI_SEEDS // 5
    assert sum(c.net.dup_rate > 0 for c in cfgs) > CI_SEEDS // 5
    assert sum(c.snapshot_chunk_bytes < 1024 for c in cfgs) > CI_SEEDS // 5
    assert sum(c.snapshot_window_chunks > 0 and c.snapshot_chunk_bytes < 1024 for c in cfgs) > CI_SEEDS // 10


@pytest.mark.soak
def test_soak_many_seeds():
    """Long run: XRAFT_SIM_SEEDS (default 5000) seeds of SOAK_STEPS steps; lists every failing seed."""
    count = int(os.environ.get("XRAFT_SIM_SEEDS", 5000))
    failures = simulator.soak_failures(range(SOAK_BASE, SOAK_BASE + count),
                                       lambda s: simulator.config_for_seed(s, steps=SOAK_STEPS),
                                       "tests/raft/test_sim_safety.py")
    assert not failures, f"{len(failures)} of {count} seeds failed:\n" + "\n".join(failures[:50])
