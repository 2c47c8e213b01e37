"""The slot-move state machine: every phase's allowed steps, routing (who_serves), migrations in
the map's encoding and validation, and random event sequences with duplicates and crashes."""
import json

import pytest
from hypothesis import event, given, settings, strategies as st

from xraft.node.cluster.changes import AdvanceMove, BeginMove, StaleEpoch, already_applied, apply_change, \
    decode_change, encode_change
from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import Migration, MovePhase, SlotMap, SlotMapError
from xraft.node.cluster.slot_move import (Abort, Copied, Decide, Finish, MoveError, Precopied, Released, Sealed,
                                          Verified, advance, begin_move, event_reached, who_serves)
from xraft.node.engine.slots import SLOT_COUNT

from .maps import advance_change, digest, next_event, nodes

ALL_EVENTS = [Precopied(), Sealed(), Copied(b"k1", 1), Copied(b"k2", 2), Verified(digest()), Verified(digest("other")),
              Decide(), Released(), Finish(), Abort("timeout")]

# phase -> the events advance() takes from it (everything else raises MoveError)
ALLOWED = {
    MovePhase.PRECOPYING: {Precopied(), Abort("timeout")},
    MovePhase.SEALING: {Sealed(), Abort("timeout")},
    MovePhase.COPYING: {Copied(b"k1", 1), Copied(b"k2", 2), Verified(digest()), Verified(digest("other")),
                        Abort("timeout")},
    MovePhase.VERIFIED: {Decide(), Abort("timeout")},
    MovePhase.DECIDED: {Released()},
    MovePhase.RELEASED: {Finish()},
    MovePhase.ABORTED: {Finish()},
}


def migration_in(phase: MovePhase) -> Migration:
    m = Migration(100, 199, 1, 2, MovePhase.PRECOPYING, 2)
    path = {MovePhase.PRECOPYING: [], MovePhase.SEALING: [Precopied()], MovePhase.COPYING: [Precopied(), Sealed()],
            MovePhase.VERIFIED: [Precopied(), Sealed(), Verified(digest())],
            MovePhase.DECIDED: [Precopied(), Sealed(), Verified(digest()), Decide()],
            MovePhase.RELEASED: [Precopied(), Sealed(), Verified(digest()), Decide(), Released()],
            MovePhase.ABORTED: [Abort("operator")]}[phase]
    for e in path:
        m = advance(m, e)
    assert m.phase is phase
    return m


@pytest.mark.parametrize("phase", list(MovePhase))
@pytest.mark.parametrize("event", ALL_EVENTS, ids=repr)
def test_transition_table(phase, event):
    m = migration_in(phase)
    if event in ALLOWED[phase]:
        nxt = advance(m, event)
        assert nxt is None or (nxt.key == m.key and nxt.problem() is None)
        assert nxt is None or event_reached(nxt, event)
    else:
        with pytest.raises(MoveError) as e:
            advance(m, event)
        assert e.value.phase is phase and e.value.event == event
        assert e.value.already_applied == event_reached(m, event)


def test_duplicates_are_refused_but_reported_as_applied():
    m = advance(advance(migration_in(MovePhase.COPYING), Copied(b"a", 1)), Copied(b"b", 2))
    for dup in (Copied(b"a", 1), Copied(b"b", 2)):
        with pytest.raises(MoveError) as e:
            advance(m, dup)
        assert e.value.already_applied
    with pytest.raises(MoveError) as e:
        advance(m, Sealed())
    assert e.value.already_applied
    v = advance(m, Verified(digest()))
    with pytest.raises(MoveError) as e:
        advance(v, Verified(digest("another manifest")))
    assert not e.value.already_applied      # a different manifest is a conflict, not a duplicate


def test_abort_after_the_decision_is_refused():
    for phase in (MovePhase.DECIDED, MovePhase.RELEASED):
        with pytest.raises(MoveError, match="can no longer be aborted"):
            advance(migration_in(phase), Abort("timeout"))


def test_the_whole_move_through_the_map():
    m = initial_layout(nodes(3), 3)
    assert who_serves(m, 150) == (1, False)
    m = apply_change(m, BeginMove(m.epoch, 100, 199, 3))
    mig = m.migrations[(100, 199)]
    assert (mig.source, mig.target, mig.phase, mig.started_epoch) == (1, 3, MovePhase.PRECOPYING, m.epoch)
    seen = []
    while m.migrations:
        seen.append((mig.phase, who_serves(m, 100), who_serves(m, 199), m.owner(150)))
        assert who_serves(m, 99) == (1, False) and who_serves(m, 200) == (1, False)
        m = apply_change(m, advance_change(m, mig, next_event(mig.phase, mig.replicated)))
        mig = m.migrations.get((100, 199))
    assert seen == [(MovePhase.PRECOPYING, (1, False), (1, False), 1),
                    (MovePhase.SEALING, (1, True), (1, True), 1),
                    (MovePhase.COPYING, (1, True), (1, True), 1),
                    (MovePhase.COPYING, (1, True), (1, True), 1),
                    (MovePhase.COPYING, (1, True), (1, True), 1),
                    (MovePhase.VERIFIED, (1, True), (1, True), 1),
                    (MovePhase.DECIDED, (3, False), (3, False), 3),
                    (MovePhase.RELEASED, (3, False), (3, False), 3)]
    assert who_serves(m, 150) == (3, False) and m.ranges(3)[0] == (100, 199)


def test_an_aborted_move_leaves_the_source_serving():
    m = initial_layout(nodes(3), 3)
    m = apply_change(m, BeginMove(m.epoch, 0, 0, 2))
    mig = m.migrations[(0, 0)]
    m = apply_change(m, advance_change(m, mig, Precopied()))
    m = apply_change(m, advance_change(m, mig, Sealed()))
    m = apply_change(m, advance_change(m, mig, Abort("timeout")))
    assert m.migrations[(0, 0)].reason == "timeout" and who_serves(m, 0) == (1, False)
    with pytest.raises(SlotMapError):
        apply_change(m, BeginMove(m.epoch, 0, 5, 2))         # still held until finished
    m = apply_change(m, advance_change(m, mig, Finish()))
    assert not m.migrations and m.owner(0) == 1
    fin = AdvanceMove(m.epoch - 1, 0, 0, mig.started_epoch, 2, Finish())
    assert already_applied(m, fin) and already_applied(m, AdvanceMove(1, 0, 0, mig.started_epoch, 2, Abort("x")))
    assert not already_applied(m, AdvanceMove(1, 0, 0, mig.started_epoch, 2, Decide()))
    m = apply_change(m, BeginMove(m.epoch, 0, 5, 2))          # the slots can move again


def test_finished_move_counts_every_main_step_as_done():
    m = initial_layout(nodes(3), 3)
    m = apply_change(m, BeginMove(m.epoch, 7, 9, 2))
    mig = m.migrations[(7, 9)]
    while m.migrations:
        m = apply_change(m, advance_change(m, m.migrations[(7, 9)], next_event(m.migrations[(7, 9)].phase,
                                                                               m.migrations[(7, 9)].replicated)))
    for e in (Precopied(), Sealed(), Copied(b"x", 9), Verified(digest()), Decide(), Released(), Finish()):
        assert already_applied(m, AdvanceMove(2, 7, 9, mig.started_epoch, 2, e)), e
    assert not already_applied(m, AdvanceMove(2, 7, 9, mig.started_epoch, 2, Abort("late")))
    assert already_applied(m, BeginMove(1, 7, 9, 2))


def test_begin_move_refusals():
    m = initial_layout(nodes(3), 3)
    for first, last, target in ((5, 4, 2), (-1, 3, 2), (0, SLOT_COUNT, 2), (0, 10, 9), (0, 10, 1), (5000, 6000, 3)):
        with pytest.raises(SlotMapError):
            begin_move(m, first, last, target)


# -- migrations in the map's bytes ----------------------------------------------------------------
def moving_map():
    m = initial_layout(nodes(3), 3)
    m = apply_change(m, BeginMove(m.epoch, 100, 199, 3))
    m = apply_change(m, BeginMove(m.epoch, 6000, 6000, 1))
    for event in (Precopied(), Sealed(), Copied(bytes(range(40)), 7)):
        m = apply_change(m, advance_change(m, m.migrations[(100, 199)], event))
    return m


def test_map_with_migrations_round_trips():
    m = moving_map()
    back = SlotMap.decode(m.encode())
    assert back == m and back.encode() == m.encode()
    assert back.migrations[(100, 199)].cursor == bytes(range(40))
    assert b'"migrations"' not in initial_layout(nodes(3), 3).encode()   # maps without moves keep their bytes


@pytest.mark.parametrize("mutate", [
    lambda ms: ms[0].update(phase="decided", digest="00" * 32),         # decided, but the source still owns
    lambda ms: ms[0].update(last=6000),                                 # overlaps the other move
    lambda ms: ms[1].update(first=100, last=199),                        # the same slots twice
    lambda ms: ms[0].update(target=ms[0]["source"]),
    lambda ms: ms[0].update(target=42),
    lambda ms: ms[0].update(started_epoch=10 ** 6),
    lambda ms: ms[0].update(phase="verified"),                           # no digest
    lambda ms: ms[0].update(digest="00" * 31),
    lambda ms: ms[0].update(cursor="0"),
    lambda ms: ms[0].update(cursor="00 01"),
    lambda ms: ms[0].update(cursor="AB"),
    lambda ms: ms[0].update(cursor="00" * 1025),
    lambda ms: ms[0].update(replicated=-1),
    lambda ms: ms[0].update(reason="why"),                              # a reason without an abort
    lambda ms: ms[0].update(phase="aborted"),                           # an abort without a reason
    lambda ms: ms[1].update(phase="sealing", cursor="aa"),
    lambda ms: ms[0].update(phase="gone"),
    lambda ms: ms[0].pop("cursor"),
    lambda ms: ms[0].update(first="100"),
    lambda ms: ms.append(5),
])
def test_decode_refuses_broken_migrations(mutate):
    obj = json.loads(moving_map().encode())
    mutate(obj["migrations"])
    with pytest.raises(SlotMapError):
        SlotMap.decode(json.dumps(obj).encode())


def test_other_changes_keep_migrations():
    m = moving_map()
    assert m.with_node(m.nodes[1]).migrations == m.migrations
    assert m.with_group(m.groups[2]).migrations == m.migrations
    with pytest.raises(SlotMapError):
        m.with_owner([150], 2)                  # a sealed slot's owner cannot change behind the move


# -- random event sequences ---------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_events_with_duplicates_and_crashes_keep_one_server(data):
    """Two moves driven by a driver that crashes (forgets what it proposed and resumes from an
    old map read), re-delivers committed changes from their bytes, and proposes stray events.
    At every map: each slot is served by exactly one group or frozen; a move's slots are
    served by the source before the decision, frozen in between, by the target after; the owner
    flips once and only at DECIDED; an abort after the decision is refused."""
    m = initial_layout(nodes(3), data.draw(st.integers(2, 4)))
    a_first = data.draw(st.integers(0, 8000))
    a = (a_first, a_first + data.draw(st.integers(0, 300)))
    b_first = data.draw(st.integers(a[1] + 1, SLOT_COUNT - 1))
    b = (b_first, min(SLOT_COUNT - 1, b_first + data.draw(st.integers(0, 300))))
    moves = {}
    for first, last in (a, b):
        owner = m.owner(first)
        if any(m.owner(s) != owner for s in range(first, last + 1)):
            continue
        target = data.draw(st.sampled_from(sorted(set(m.groups) - {owner})))
        m = apply_change(m, BeginMove(m.epoch, first, last, target))
        moves[(first, last)] = dict(source=owner, target=target, started=m.epoch, flips=0, aborted=False)
    committed = []              # bytes of every change that applied
    old_reads = [m]             # maps a crashed driver may have read before it died
    for _ in range(data.draw(st.integers(1, 60))):
        key = data.draw(st.sampled_from(sorted(moves)))
        mv = moves[key]
        mig = m.migrations.get(key)
        action = data.draw(st.sampled_from(["next"] * 6 + ["redeliver", "stray", "crash", "abort"]))
        if action == "redeliver" and committed:
            change = decode_change(data.draw(st.sampled_from(committed)))
        elif action == "crash":
            # A driver that read an older map proposes the step it thought was next.
            seen = data.draw(st.sampled_from(old_reads))
            old = seen.migrations.get(key)
            if old is None:
                continue
            change = AdvanceMove(seen.epoch, key[0], key[1], mv["started"], mv["target"],
                                 next_event(old.phase, old.replicated))
        elif mig is None:
            continue
        elif action == "next":
            change = advance_change(m, mig, next_event(mig.phase, mig.replicated))
        elif action == "abort":
            change = advance_change(m, mig, Abort("timeout"))
        else:
            change = advance_change(m, mig, data.draw(st.sampled_from(ALL_EVENTS)))
        before = m
        try:
            m = apply_change(m, change)
        except StaleEpoch:
            assert change.expect_epoch < m.epoch
        except MoveError as e:
            if isinstance(change.event, Abort) and mig is not None and mig.phase in (MovePhase.DECIDED,
                                                                                   MovePhase.RELEASED):
                assert "can no longer be aborted" in str(e)
        else:
            event("applied " + change.event.kind)
            committed.append(encode_change(change))
            old_reads.append(before)
            assert already_applied(m, change)
        _check_serving(m, moves, before)
        assert SlotMap.decode(m.encode()) == m
    # Whatever happened, each move can still be driven to its end, and an abort after the
    # decision is refused on the way.
    for key, mv in moves.items():
        while key in m.migrations:
            mig = m.migrations[key]
            if mig.phase in (MovePhase.DECIDED, MovePhase.RELEASED):
                with pytest.raises(MoveError):
                    apply_change(m, advance_change(m, mig, Abort("late")))
            before = m
            m = apply_change(m, advance_change(m, mig, next_event(mig.phase, mig.replicated)))
            _check_serving(m, moves, before)
        final = {m.owner(s) for s in range(key[0], key[1] + 1)}
        assert final == ({mv["source"]} if mv["aborted"] else {mv["target"]})
        assert mv["flips"] == (0 if mv["aborted"] else 1)
        event("a move ended %s" % ("aborted" if mv["aborted"] else "moved"))
    assert not m.migrations


def _check_serving(m: SlotMap, moves: dict, before: SlotMap) -> None:
    for (first, last), mv in moves.items():
        mig = m.migrations.get((first, last))
        owners = {m.owner(s) for s in (first, (first + last) // 2, last)}
        assert len(owners) == 1
        owner = owners.pop()
        if owner != before.owner(first):
            mv["flips"] += 1
            assert owner == mv["target"] and mig is not None and mig.phase is MovePhase.DECIDED
        assert mv["flips"] <= 1
        if mig is not None and mig.phase is MovePhase.ABORTED:
            mv["aborted"] = True
            assert mv["flips"] == 0
        for s in (first, last):
            group, frozen = who_serves(m, s)
            if mig is not None and mig.phase in (MovePhase.SEALING, MovePhase.COPYING, MovePhase.VERIFIED):
                assert frozen and group == mv["source"]
            elif mig is not None and mig.phase is MovePhase.PRECOPYING:
                assert not frozen and group == mv["source"]
            else:
                assert not frozen and group == owner == (mv["target"] if mv["flips"] else mv["source"])
        for s in (first - 1, last + 1):
            if 0 <= s < SLOT_COUNT and m.migration_of(s) is None:
                assert who_serves(m, s) == (m.owner(s), False)
