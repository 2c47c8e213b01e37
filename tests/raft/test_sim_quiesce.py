"""The whole-cluster simulator with quiescence on (node/raft/quiesce.py).

The same swarm of seeds as test_sim_safety.py (crashes, pauses, partitions, loss,
duplication, membership changes, transfers, snapshots) with Config.quiesce on every node
and the simulation playing the runtime's leader-node watch (Simulation.watch_quiesced_leaders):
Raft's safety properties and the healed cluster's settling must hold exactly as without
it, and client histories must stay linearizable. Quiescence must also really happen in
these runs, or they would prove nothing about it.

    XRAFT_SIM_SEED=1234 XRAFT_SIM_STEPS=1500 python -m pytest tests/raft/test_sim_quiesce.py -q
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.raft.sim import simulator
from tests.raft.sim.network import NetConfig
from tests.raft.sim.seeds import selected_seeds, selected_steps

CI_SEEDS = 150
CI_STEPS = 1500
BASE = 2_000_000  # distinct from the other simulator tests' seeds
LIN_SEEDS = 20
LIN_BASE = 2_500_000
IDLE_SEEDS = 30
IDLE_BASE = 2_700_000

_SEEDS = selected_seeds(CI_SEEDS, base=BASE)
_LIN_SEEDS = selected_seeds(LIN_SEEDS, base=LIN_BASE)
_IDLE_SEEDS = selected_seeds(IDLE_SEEDS, base=IDLE_BASE)
TEST_FILE = "tests/raft/test_sim_quiesce.py"


def quiet_config(seed: int, steps: int) -> simulator.SimConfig:
    return replace(simulator.config_for_seed(seed, steps=steps), quiesce=True)


@pytest.mark.parametrize("seed", _SEEDS)
def test_seed_is_safe_and_settles_with_quiescence(seed):
    steps = selected_steps(CI_STEPS)
    res = simulator.run(seed, quiet_config(seed, steps), test_file=TEST_FILE)
    assert res.steps == steps and res.settle_steps > 0


@pytest.mark.parametrize("seed", _LIN_SEEDS)
def test_history_is_linearizable_with_quiescence(seed):
    steps = selected_steps(2000)
    cfg = replace(simulator.client_heavy_config(seed, steps), quiesce=True)
    res = simulator.run(seed, cfg, test_file=TEST_FILE)
    assert res.linearizable is not False


def idle_config(seed: int, steps: int) -> simulator.SimConfig:
    """No clients and rare faults: long quiesced stretches, broken by crashes (a leader's
    node going away), pauses and partitions; the swarm seeds above are mostly too busy."""
    r = random.Random(seed)
    return simulator.SimConfig(nodes=r.choice((3, 5)), steps=steps, net=NetConfig(max_delay=r.randint(0, 4)),
                               clients=1, w_client=0.0, w_crash=0.001, w_pause=0.0005, w_partition=0.0005,
                               quiesce=True)


@pytest.mark.parametrize("seed", _IDLE_SEEDS)
def test_idle_cluster_with_rare_faults_is_safe_and_settles(seed):
    steps = selected_steps(2000)
    res = simulator.run(seed, idle_config(seed, steps), test_file=TEST_FILE)
    assert res.steps == steps and res.settle_steps > 0


def test_idle_clusters_spend_most_ticks_quiesced():
    results = [simulator.run(s, idle_config(s, 2000)) for s in range(IDLE_BASE, IDLE_BASE + 10)]
    assert sum(r.quiesced_ticks for r in results) >= 1000, [r.quiesced_ticks for r in results]


def test_groups_do_quiesce_in_these_runs():
    """Most seeds spend ticks quiesced (idle stretches between client requests and faults)."""
    results = [simulator.run(s, quiet_config(s, 800)) for s in range(BASE, BASE + 20)]
    assert sum(r.quiesced_ticks > 0 for r in results) >= 15, [r.quiesced_ticks for r in results]


def test_quiescence_off_is_the_default():
    res = simulator.run(BASE, simulator.config_for_seed(BASE, steps=800))
    assert res.quiesced_ticks == 0
