"""Costs of loading a snapshot that must not grow with what the snapshot holds (issue 14:
restarts and snapshot installs of large states). Counted, never timed."""
import gc

from xraft.node.engine import commands
from xraft.node.engine.pel import PelMap
from xraft.node.fsm.state_machine import StateMachine

PENDING = 5_000


def _state_with_pending() -> bytes:
    sm = StateMachine()
    db = sm.keyspace
    for i in range(1, PENDING + 1):
        commands.execute(db, [b"XADD", b"s", b"%d-0" % i, b"f", b"v"], 0)
    commands.execute(db, [b"XGROUP", b"CREATE", b"s", b"g", b"0"], 0)
    commands.execute(db, [b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"2500", b"STREAMS", b"s", b">"], 0)
    commands.execute(db, [b"XREADGROUP", b"GROUP", b"g", b"d", b"STREAMS", b"s", b">"], 0)
    return sm.snapshot()


def test_restore_runs_no_garbage_collection():
    """Every object a load makes stays alive; a collection would only rescan them (each one
    more costly the larger the state). With the collector on, these allocations trigger some."""
    data = _state_with_pending()
    starts = []

    def count(phase, _info):
        if phase == "start":
            starts.append(1)
    restored = StateMachine()
    was = gc.isenabled()
    gc.enable()
    gc.callbacks.append(count)
    try:
        restored.restore(data)
        during = len(starts)
        _state_with_pending()                     # the same allocations, not paused: the control
        control = len(starts) - during
    finally:
        gc.callbacks.remove(count)
        if not was:
            gc.disable()
    assert during <= 1        # at most one, started by the allocations that open the paused block
    assert control >= 5, control
    assert gc.isenabled()                         # resumed after the load
    assert restored.snapshot() == data


def test_pel_loads_with_bulk_extends_not_per_entry_inserts(monkeypatch):
    """A PEL of n entries loads with one extend_sorted per PEL (group and each consumer), not
    n inserts."""
    data = _state_with_pending()
    calls = {"insert": 0, "extend_sorted": 0}
    for name in calls:
        real = getattr(PelMap, name)

        def counted(self, *args, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *args)
        monkeypatch.setattr(PelMap, name, counted)
    restored = StateMachine()
    restored.restore(data)
    assert calls == {"insert": 0, "extend_sorted": 3}     # the group's PEL, consumers c and d
    assert restored.snapshot() == data


def test_a_decode_made_elsewhere_restores_the_same_state_and_only_for_its_bytes():
    """An installed snapshot is decoded off the loop (parse_snapshot, in the storage job) and
    swapped in by restore(buf, parsed): the same state as restore(buf) alone; a decode of
    other bytes (equal or not) is not taken, and a parse leaves the machine untouched."""
    data = _state_with_pending()
    target = StateMachine()
    before = target.snapshot()
    parsed = StateMachine.parse_snapshot(data)
    assert target.snapshot() == before            # parsing changed nothing
    target.restore(data, parsed)
    assert target.snapshot() == data
    other = StateMachine()
    stale = StateMachine.parse_snapshot(before)   # a decode of other bytes: ignored
    other.restore(data, stale)
    assert other.snapshot() == data
