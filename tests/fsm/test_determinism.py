"""Determinism: the same log gives byte-identical state on every replica, whatever
the replica's history (fresh, restored from a snapshot) or its process (hash seed)."""
import hashlib
import os
import random
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fsm.loggen import DataPicker, RandomPicker, gen_log, run_log
from xraft.node.fsm.results import encode_result
from xraft.node.fsm.state_machine import StateMachine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYP
@given(st.data())
def test_two_replicas_agree_at_every_step(data):
    log = gen_log(DataPicker(data), data.draw(st.integers(1, 40)))
    a = run_log(StateMachine(), log)
    b = run_log(StateMachine(), log)
    for (ra, sa), (rb, sb) in zip(a, b):
        assert sa == sb
        assert [encode_result(r) for r in ra] == [encode_result(r) for r in rb]


@HYP
@given(st.data())
def test_snapshot_restore_then_the_rest_equals_applying_everything(data):
    log = gen_log(DataPicker(data), data.draw(st.integers(1, 40)))
    full = run_log(StateMachine(), log)
    cut = data.draw(st.integers(0, len(log)))
    head = StateMachine()
    run_log(head, log[:cut])
    replica = StateMachine()
    replica.restore(head.snapshot())
    assert replica.snapshot() == head.snapshot()
    rest = run_log(replica, log[cut:], cut + 1)
    assert [s for _, s in rest] == [s for _, s in full[cut:]]
    assert [[encode_result(r) for r in res] for res, _ in rest] == \
        [[encode_result(r) for r in res] for res, _ in full[cut:]]


_CHILD = r"""
import hashlib, random, sys
sys.path.insert(0, sys.argv[1])
from tests.fsm.loggen import RandomPicker, gen_log
from xraft.node.fsm.results import encode_result
from xraft.node.fsm.state_machine import StateMachine
for seed in range(int(sys.argv[2])):
    sm = StateMachine()
    h = hashlib.sha256()
    for i, data in enumerate(gen_log(RandomPicker(random.Random(seed)), 60), 1):
        for r in sm.apply(i, data):
            h.update(encode_result(r))
        h.update(sm.snapshot())
    print(h.hexdigest())
"""

SEEDS = 15


def _digests_here():
    out = []
    for seed in range(SEEDS):
        sm = StateMachine()
        h = hashlib.sha256()
        for i, data in enumerate(gen_log(RandomPicker(random.Random(seed)), 60), 1):
            for r in sm.apply(i, data):
                h.update(encode_result(r))
            h.update(sm.snapshot())
        out.append(h.hexdigest())
    return out


def test_a_replica_in_another_process_with_another_hash_seed_agrees():
    # Iterating a set or dict of bytes in hash order would give a different
    # order under another PYTHONHASHSEED: this catches that, in-process tests cannot.
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-c", _CHILD, ROOT, str(SEEDS)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == _digests_here()
