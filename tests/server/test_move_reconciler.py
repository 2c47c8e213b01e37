"""The move reconciler against the real metadata state machine (MetaMachine, applied in
process) and a recording stand-in for the data groups' MoveSteps (the real one lives on the
slotdata branch; the end-to-end cluster test runs it).

Checked: the healthy path calls the data steps in the contract's order and ends with the
target owning the slots; any prefix of rounds followed by a NEW reconciler (a new metadata
leader: nothing carried over but the map) still finishes; lost replies (UnknownOutcome after
the entry committed) and failing steps are resumed from the map; a move not decided within
the timeout is aborted and the source unsealed; a non-leader does nothing."""
import asyncio

import pytest

from xraft.node.cluster.changes import BeginMove, encode_change
from xraft.node.cluster.meta_machine import MetaMachine
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec
from xraft.node.runtime.driver_api import UnknownOutcome
from xraft.node.server.move_reconciler import COPY_END, MoveReconciler
from xraft.node.server.slot_move_steps import MoveStepRefused

DIGEST = b"\x07" * 32
FIRST, LAST = 100, 199


def founding():
    nodes = {i: NodeSpec(i, "127.0.0.1:%d" % (7000 + i), "127.0.0.1:%d" % (6000 + i)) for i in (1, 2, 3)}
    return initial_layout(nodes, 3, 3)


class LocalMeta:
    """Group 0 as one in-process machine: propose applies at once."""

    def __init__(self):
        self.machine = MetaMachine(founding())
        self.index = 1
        self.leader = True
        self.lose_replies = 0          # the next N proposals apply, then report UnknownOutcome

    @property
    def slot_map(self):
        return self.machine.slot_map

    def is_leader(self):
        return self.leader

    async def propose(self, change, timeout):
        self.index += 1
        result = self.machine.apply(self.index, encode_change(change))
        if self.lose_replies:
            self.lose_replies -= 1
            raise UnknownOutcome(0, "reply lost", 1, self.index)
        return result

    async def wait_change(self, timeout):
        await asyncio.sleep(0)

    def begin(self, target=3):
        self.propose_sync(BeginMove(self.slot_map.epoch, FIRST, LAST, target))

    def propose_sync(self, change):
        self.index += 1
        self.machine.apply(self.index, encode_change(change))


class Steps:
    def __init__(self, fail=()):
        self.calls = []
        self.fail = dict.fromkeys(fail, 1)    # step name -> failures left

    async def _do(self, name, *args):
        self.calls.append(name)
        if self.fail.get(name):
            self.fail[name] -= 1
            raise RuntimeError(f"{name} failed")

    async def precopy(self, a, b, first, last, epoch):
        await self._do("precopy")
        if self.fail.get("precopy-refused"):
            self.fail["precopy-refused"] -= 1
            raise MoveStepRefused("ERR xraft: bad cursor: offset 9 in a record of 3 bytes")
        return 2

    async def seal(self, a, first, last, epoch):
        await self._do("seal", a, first, last, epoch)

    async def copy(self, a, b, first, last, epoch, cursor=None, progress=None):
        await self._do("copy")
        progress(b"\x00", 1)
        progress(COPY_END, 2)
        return COPY_END, 2

    async def verify(self, a, b, first, last, epoch):
        await self._do("verify")
        return DIGEST

    async def activate(self, b, first, last, epoch, digest):
        assert digest == DIGEST
        await self._do("activate")

    async def release(self, a, first, last, epoch):
        await self._do("release")

    async def abort(self, a, b, first, last, epoch):
        await self._do("abort")


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


async def drive(rec, meta, limit=50):
    for _ in range(limit):
        try:
            if not await rec.round():
                return
        except (RuntimeError, UnknownOutcome):
            pass                         # run() logs and retries the same way


def test_healthy_path_calls_steps_in_order_and_moves_the_slots():
    meta, steps = LocalMeta(), Steps()
    meta.begin()
    source = meta.slot_map.owner(FIRST)
    run(drive(MoveReconciler(meta, steps), meta))
    assert steps.calls == ["precopy", "seal", "copy", "verify", "activate", "release", "activate"]
    m = meta.slot_map
    assert not m.migrations and all(m.owner(s) == 3 for s in (FIRST, LAST)) and source != 3
    assert m.epoch == 2 + 7          # BeginMove, then Precopied Sealed Copied Verified Decide Released Finish


@pytest.mark.parametrize("rounds", range(8))
def test_a_new_leader_resumes_from_the_map_alone(rounds):
    meta, steps = LocalMeta(), Steps()
    meta.begin()
    run(drive(MoveReconciler(meta, steps), meta, limit=rounds))
    run(drive(MoveReconciler(meta, Steps()), meta))
    assert not meta.slot_map.migrations and meta.slot_map.owner(FIRST) == 3


def test_lost_replies_and_failed_steps_are_resumed():
    meta, steps = LocalMeta(), Steps(fail=("seal", "copy", "activate", "release"))
    meta.begin()
    meta.lose_replies = 3
    run(drive(MoveReconciler(meta, steps), meta))
    assert not meta.slot_map.migrations and meta.slot_map.owner(FIRST) == 3
    assert steps.calls.count("seal") == 2 and "abort" not in steps.calls


def test_a_failed_pre_copy_is_retried_and_a_refused_one_only_skips_to_the_seal():
    meta, steps = LocalMeta(), Steps(fail=("precopy", "precopy-refused"))
    meta.begin()
    run(drive(MoveReconciler(meta, steps), meta))
    assert not meta.slot_map.migrations and meta.slot_map.owner(FIRST) == 3
    # failed (unavailable: retried next round), then refused (sealed anyway), then sealed
    assert steps.calls[:4] == ["precopy", "precopy", "seal", "copy"] and "abort" not in steps.calls


def test_undecided_move_times_out_into_an_abort():
    now = [0.0]
    meta, steps = LocalMeta(), Steps(fail=("seal",) * 1)
    steps.fail["seal"] = 10 ** 6                     # the source never seals
    meta.begin()
    source = meta.slot_map.owner(FIRST)
    rec = MoveReconciler(meta, steps, move_timeout_s=30, clock=lambda: now[0])
    run(drive(rec, meta, limit=3))
    assert meta.slot_map.migrations                  # still trying
    now[0] = 31.0
    run(drive(rec, meta))
    assert not meta.slot_map.migrations and meta.slot_map.owner(FIRST) == source
    assert steps.calls[-1] == "abort"


def test_a_decided_move_is_never_aborted_by_the_timeout():
    now = [0.0]
    meta, steps = LocalMeta(), Steps()
    steps.fail["release"] = 3
    meta.begin()
    rec = MoveReconciler(meta, steps, move_timeout_s=30, clock=lambda: now[0])
    run(drive(rec, meta, limit=5))                   # up to DECIDED
    now[0] = 100.0
    run(drive(rec, meta))
    assert meta.slot_map.owner(FIRST) == 3 and "abort" not in steps.calls


def test_not_the_leader_does_nothing():
    meta, steps = LocalMeta(), Steps()
    meta.begin()
    meta.leader = False
    assert run(MoveReconciler(meta, steps).round()) is False
    assert steps.calls == [] and meta.slot_map.migrations


def test_failpoint_kills_the_first_process_only(tmp_path):
    import os
    import subprocess
    import sys
    code = "from xraft.node.server.move_reconciler import failpoint; failpoint('move.copying.step'); print('alive')"
    env = dict(os.environ, XRAFT_FAILPOINTS="move.sealing.step,move.copying.step",
               XRAFT_FAILPOINTS_ONCE=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == -9 and (tmp_path / "move.copying.step").exists()
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and second.stdout.strip() == "alive"
    other = dict(env, XRAFT_FAILPOINTS="move.decided.step")
    third = subprocess.run([sys.executable, "-c", code], env=other, capture_output=True, text=True, timeout=60)
    assert third.returncode == 0


def test_a_refused_step_before_the_decision_aborts_with_its_reason():
    from xraft.node.server.slot_move_steps import DigestMismatch

    class Mismatch(Steps):
        async def verify(self, a, b, first, last, epoch):
            await self._do("verify")
            raise DigestMismatch(b"\x01" * 32, b"\x02" * 32)

    meta, steps = LocalMeta(), Mismatch()
    meta.begin()
    source = meta.slot_map.owner(FIRST)
    seen = []
    meta.machine.add_listener(lambda m: seen.extend(m.migrations.values()))
    run(drive(MoveReconciler(meta, steps), meta))
    assert not meta.slot_map.migrations and meta.slot_map.owner(FIRST) == source
    assert steps.calls == ["precopy", "seal", "copy", "verify", "abort"]
    aborted = [m for m in seen if m.phase.value == "aborted"]
    assert aborted and "digest" in aborted[0].reason.lower()
