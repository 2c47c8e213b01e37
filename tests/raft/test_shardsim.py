"""The sharded-cluster simulator (tests/raft/shardsim/): a metadata group, two data groups and
the move driver on the real Raft core and the real state machines, under drops, delays,
duplicates, partitions and crashes, with the invariants of issue 10 checked at every first
application of a log index and at the end (shardsim/checker.py). A failure prints the seed,
the configuration, a one-line reproduction command and the last events.

    XRAFT_SIM_SEED=7 XRAFT_SIM_STEPS=8000 python -m pytest tests/raft/test_shardsim.py -q
    XRAFT_SIM_SEEDS=2000 python -m pytest tests/raft/test_shardsim.py -m soak -q
"""
from __future__ import annotations

import os

import pytest

from xraft.node.fsm import slot_move_apply
from tests.raft.shardsim.checker import Violation
from tests.raft.shardsim.world import ShardSimConfig, ShardSimFailure, config_for_seed, run
from tests.raft.sim.seeds import selected_seeds, selected_steps



@pytest.fixture(autouse=True)
def _prepare_every_chunk(monkeypatch):
    """Odd nodes' replicas run StateMachine.prepare before each apply (shardsim DataAdapter);
    here for every slot-move chunk, not only those of a node's PREPARE_MIN_BYTES."""
    monkeypatch.setattr(slot_move_apply, "PREPARE_MIN_BYTES", 1)


CI_SEEDS = 4
CI_STEPS = 6000
SOAK_STEPS = 12000
SOAK_BASE = 1_000_000          # soak seeds never overlap the CI ones
SOAK_PARTS = 4


@pytest.mark.parametrize("seed", selected_seeds(CI_SEEDS, base=1))
def test_seed_keeps_every_invariant(seed):
    sim = run(seed, config_for_seed(seed, steps=selected_steps(CI_STEPS)))
    # not vacuous: slots moved and clients got answers
    assert sim.moves_begun >= 1 and sim.ledger.acked


def test_a_fault_free_run_moves_slots_both_ways_and_serves_them_at_both_groups():
    sim = run(3, ShardSimConfig(steps=6000, moves=2))
    assert sim.moves_wanted == 0
    moving = set(sim.checker.slots)
    served_at = {(g, s) for (g, s) in sim.checker.served if s in moving}
    assert {g for g, _ in served_at} == {1, 2}, served_at
    # the odd nodes' replicas decoded chunks ahead of their applies (and the states still agree)
    assert sum(getattr(r.machine, "prepared", 0) for g in (1, 2) for r in sim.replicas(g)) > 0


def test_same_seed_same_run():
    cfg = ShardSimConfig(steps=1500, moves=2, drop_rate=0.05, dup_rate=0.05, w_crash=0.01, w_partition=0.01,
                         w_campaign=0.005, log_bound=8, move_timeout=400)
    a, b = (run(5, cfg) for _ in range(2))
    assert a.ledger.acked and a.stats["ev_fault"] > 0
    assert list(a.trace) == list(b.trace) and a.stats == b.stats and a.ledger.acked == b.ledger.acked


def test_the_checker_catches_a_source_that_serves_after_the_decision():
    """Checker self-test: a driver that unseals the source at DECIDED makes two groups serve."""
    with pytest.raises(ShardSimFailure) as info:
        run(3, ShardSimConfig(steps=6000, moves=1, inject=frozenset({"unseal_at_decide"})))
    assert "is served by group 1 but the committed map" in str(info.value)
    assert "reproduce: XRAFT_SIM_SEED=3" in str(info.value)
    assert isinstance(info.value.__cause__, Violation)


def test_the_checker_catches_a_retry_applied_twice():
    """Checker self-test: a client that retries with a new request id (no at-most-once)."""
    for seed in range(1, 40):        # an early seed catches it; later ones if the simulation changes
        try:
            run(seed, config_for_seed(seed, steps=3000, inject=frozenset({"new_seq_on_retry"})))
        except ShardSimFailure as exc:
            # an XADD applied twice, an XREADGROUP applied twice (entries pending nobody saw), or
            # an XACK applied twice (the answer the client sees is the second one's: acked 0)
            assert any(t in str(exc) for t in ("in the stream 2 times", "at the owner 2 times", "PEL of",
                                               "none acked")), str(exc)
            return
    pytest.fail("no seed caught a retry applied twice")


@pytest.mark.soak
@pytest.mark.parametrize("part", range(SOAK_PARTS))
def test_soak_many_seeds(part):
    """XRAFT_SIM_SEEDS (default 300) seeds of SOAK_STEPS steps, in SOAK_PARTS parts (so
    `./dev soak`'s workers share them); lists every failing seed with its reproduction."""
    count = int(os.environ.get("XRAFT_SIM_SEEDS", 300))
    failures = []
    for seed in range(SOAK_BASE + part, SOAK_BASE + count, SOAK_PARTS):
        try:
            run(seed, config_for_seed(seed, steps=SOAK_STEPS))
        except ShardSimFailure as exc:
            lines = str(exc).splitlines()
            failures.append(lines[0] + " | " + lines[2])
    assert not failures, "%d seeds failed:\n%s" % (len(failures), "\n".join(failures[:50]))
