"""The cyclic collector and a slot move's STAGE decode (fsm/gc_pause.py): no collection runs
inside the decode, whether the node's prepare thread made it ahead or the apply made it, and
the move still ends with B equal to A. Also gc_paused itself: blocks overlapping as threads
would, a collector that was off, and the block's objects left in the oldest generation.
Collections are counted (gc.callbacks), never timed."""
import gc

import pytest

from xraft.node.engine.replies import OK
from xraft.node.fsm import slot_move_apply
from xraft.node.fsm.entry import Kind, Request, encode_record
from xraft.node.fsm.gc_pause import gc_paused
from xraft.node.fsm.slot_export import export_chunk, manifest
from xraft.node.fsm.slot_move_apply import move_argv
from xraft.node.fsm.slot_moves import END, encode_cursor

from .test_slot_moves import M, NOW, group_a, group_b, step, views
from .test_slot_precopy import fill_big

# A young generation of 200 objects: the decode of a stream with 500 pending entries (a NACK
# and its StreamIDs each) crosses it many times over when nothing pauses the collector.
LOW = (200, 5, 5)


class _Decodes:
    """slot_move_apply's load_records, wrapped: `started` gets the generation of every
    collection that starts while one of its calls runs."""

    def __init__(self, real):
        self.real, self.inside, self.calls, self.started = real, 0, 0, []

    def __call__(self, buf):
        self.calls += 1
        self.inside += 1
        try:
            return self.real(buf)
        finally:
            self.inside -= 1

    def on_gc(self, phase, info):
        if phase == "start" and self.inside:
            self.started.append(info["generation"])


@pytest.fixture
def collector_on():
    """The collector on, with LOW thresholds; put back as it was afterwards."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*LOW)
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


@pytest.fixture
def decodes(collector_on, monkeypatch):
    d = _Decodes(slot_move_apply.load_records)
    monkeypatch.setattr(slot_move_apply, "load_records", d)
    gc.callbacks.append(d.on_gc)
    yield d
    gc.callbacks.remove(d.on_gc)


def _stage(b, cursor, nxt, last_now, records, sessions, ahead: bool):
    """STAGE one chunk at b; with `ahead`, its decode made first by StateMachine.prepare, as
    the node's prepare thread makes it (runtime/apply_ahead.py)."""
    data = encode_record(NOW, [Request(0, 0, Kind.SLOT_MOVE, (
        move_argv("STAGE", M, cursor, nxt, b"%d" % last_now, records, sessions),))])
    index = b.applied_index + 1
    if ahead:
        fn = b.prepare(index, data)
        assert fn is not None
        fn()
        assert b.prepared
    r = b.apply(index, data)[0]
    assert not b.prepared                        # a decode made ahead was taken by the apply
    return r


@pytest.mark.parametrize("ahead", [False, True], ids=["in-the-apply", "ahead-in-the-prepare-thread"])
def test_no_collection_runs_inside_a_stage_decode_and_b_ends_equal_to_a(decodes, ahead):
    a, b = group_a(), group_b()
    fill_big(a)                                  # 3000 entries, a group with 500 pending
    at_a = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    cursor = encode_cursor(M.first, 0)
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 1 << 20)
        big = len(records) >= slot_move_apply.PREPARE_MIN_BYTES
        assert _stage(b, cursor, nxt, a.last_now_ms, records, sessions, ahead and big) >= 0
        cursor = nxt
    assert decodes.calls >= 1
    assert decodes.started == []                 # no collection started inside a STAGE decode
    assert step(b, "ACTIVATE", manifest(a, M)) == OK
    assert views(b, NOW + 1000) == at_a

    # The control: the same chunk decoded with the collector running starts collections.
    chunk = export_chunk(a, M, encode_cursor(M.first, 0), 1 << 20)[0]
    decodes(chunk)
    assert len(decodes.started) >= 3, decodes.started


def test_activate_after_a_restart_decodes_with_no_collection(decodes):
    """A staging restored from a snapshot has no decoded values: ACTIVATE decodes its records."""
    a, b = group_a(), group_b()
    fill_big(a)
    at_a = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    cursor = encode_cursor(M.first, 0)
    while cursor != END:
        records, nxt, _, sessions = export_chunk(a, M, cursor, 1 << 20)
        assert _stage(b, cursor, nxt, a.last_now_ms, records, sessions, False) >= 0
        cursor = nxt
    restarted = group_b()
    restarted.restore(b.snapshot())
    calls = decodes.calls
    assert step(restarted, "ACTIVATE", manifest(a, M)) == OK
    assert decodes.calls > calls                 # ACTIVATE decoded the staged records
    assert decodes.started == []
    assert views(restarted, NOW + 1000) == at_a


def _young_and_old(objs) -> tuple:
    """How many of objs are in generation 0, and in generation 2 (by identity)."""
    ids = {id(o) for o in objs}
    return (sum(id(o) in ids for o in gc.get_objects(0)), sum(id(o) in ids for o in gc.get_objects(2)))


def test_what_a_paused_block_made_goes_to_the_oldest_generation_unscanned(collector_on):
    started = []

    def on_gc(phase, info):
        if phase == "start":
            started.append(info["generation"])
    gc.callbacks.append(on_gc)
    try:
        with gc_paused():
            kept = [[i] for i in range(5000)]    # 25 young generations' worth
        young_after = gc.get_count()[0]
        where = _young_and_old(kept)
    finally:
        gc.callbacks.remove(on_gc)
    assert started == []                         # none inside, none at the block's end
    assert young_after < LOW[0]                  # the young count starts again from 0
    assert where == (0, len(kept))

    # The control: made outside a block, they are collected on their way through the young
    # generations.
    gc.callbacks.append(on_gc)
    try:
        kept = [[i] for i in range(5000)]
    finally:
        gc.callbacks.remove(on_gc)
    assert len(started) >= 10


def test_overlapping_blocks_turn_the_collector_back_on_when_the_last_one_ends(collector_on):
    """Blocks of two threads may end in any order: the collector stays off until both ended."""
    first, second = gc_paused(), gc_paused()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)             # the first one in ends first
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()

    with pytest.raises(ValueError):
        with gc_paused():
            with gc_paused():
                raise ValueError("a damaged record")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector_on):
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
