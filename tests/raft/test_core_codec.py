"""Codec: round trips of every record, and garbage never raises anything but CodecError."""
import random
import struct

import pytest
from hypothesis import given, settings, strategies as st

from xraft.node.raft import codec as c
from xraft.node.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)

u63 = st.integers(min_value=0, max_value=(1 << 63) - 1)
node_id = st.integers(min_value=1, max_value=(1 << 63) - 1)
small_bytes = st.binary(max_size=64)

entries = st.builds(Entry, term=u63, index=u63, type=st.sampled_from(list(EntryType)), data=small_bytes)


@st.composite
def conf_states(draw):
    ids = draw(st.lists(st.integers(1, 50), unique=True, max_size=12))
    random.Random(draw(st.integers(0, 9))).shuffle(ids)
    k = len(ids)
    a, b, d = sorted(draw(st.lists(st.integers(0, k), min_size=3, max_size=3)))
    voters, learners, removed = ids[:a], ids[a:b], ids[d:]
    outgoing = sorted(set(draw(st.lists(st.sampled_from(voters), max_size=3))) if voters else set())
    lnext = sorted(set(outgoing[:1]))
    return ConfState(tuple(sorted(voters)), tuple(sorted(learners)), tuple(outgoing), tuple(lnext),
                     draw(st.booleans()) and bool(outgoing), tuple(sorted(removed)))


snapshots = st.builds(Snapshot, metadata=st.builds(SnapshotMetadata, index=u63, term=u63,
                                                   conf_state=conf_states()), data=small_bytes)


@st.composite
def messages(draw):
    snap = draw(st.none() | snapshots)
    off = draw(st.integers(0, 100))
    total = off + (len(snap.data) if snap else 0) + draw(st.integers(0, 100))
    return Message(type=draw(st.sampled_from(list(MessageType))), to=draw(u63), frm=draw(u63),
                   term=draw(u63), log_term=draw(u63), index=draw(u63),
                   entries=tuple(draw(st.lists(entries, max_size=5))), commit=draw(u63),
                   snapshot=snap, reject=draw(st.booleans()), reject_hint=draw(u63),
                   context=draw(small_bytes), chunk_offset=off, chunk_total=total)


changes = st.builds(ConfChangeSingle, type=st.sampled_from(list(ConfChangeType)), node_id=node_id)


@given(entries)
def test_entry_round_trip(e):
    assert c.decode_entry(c.encode_entry(e)) == e
    assert len(c.encode_entry(e)) == 2 + c.entry_encoded_size(e)


@given(st.builds(HardState, term=u63, vote=u63, commit=u63))
def test_hard_state_round_trip(hs):
    assert c.decode_hard_state(c.encode_hard_state(hs)) == hs


@given(conf_states())
def test_conf_state_round_trip(cs):
    assert c.decode_conf_state(c.encode_conf_state(cs)) == cs


@given(snapshots)
def test_snapshot_round_trip(s):
    assert c.decode_snapshot(c.encode_snapshot(s)) == s
    assert c.decode_snapshot_metadata(c.encode_snapshot_metadata(s.metadata)) == s.metadata


@settings(max_examples=150)
@given(messages())
def test_message_round_trip(m):
    assert c.decode_message(c.encode_message(m)) == m


@given(st.builds(ConfChange, type=st.sampled_from(list(ConfChangeType)), node_id=node_id, context=small_bytes),
       st.builds(ConfChangeV2, transition=st.sampled_from(list(ConfChangeTransition)),
                 changes=st.lists(changes, max_size=6).map(tuple), context=small_bytes))
def test_conf_change_round_trips(cc, cc2):
    assert c.decode_conf_change(c.encode_conf_change(cc)) == cc
    assert c.decode_conf_change_v2(c.encode_conf_change_v2(cc2)) == cc2
    t, data = c.conf_change_entry_data(cc2)
    assert c.decode_conf_change_entry(Entry(1, 1, t, data)) == cc2


DECODERS = [c.decode_entry, c.decode_hard_state, c.decode_conf_state, c.decode_snapshot,
            c.decode_snapshot_metadata, c.decode_message, c.decode_conf_change, c.decode_conf_change_v2]


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, len(DECODERS) - 1))
def test_garbage_only_raises_codec_error(buf, k):
    try:
        DECODERS[k](buf)
    except c.CodecError:
        pass


@settings(max_examples=200)
@given(messages(), st.data())
def test_mutated_messages_only_raise_codec_error(m, data):
    buf = bytearray(c.encode_message(m))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    for candidate in (bytes(buf), bytes(buf[:cut])):
        try:
            c.decode_message(candidate)
        except c.CodecError:
            pass


def test_every_truncation_of_a_message_is_rejected():
    m = Message(MessageType.APP, to=2, frm=1, term=3, entries=(Entry(3, 4, data=b"abc"),), context=b"x")
    buf = c.encode_message(m)
    for cut in range(len(buf)):
        with pytest.raises(c.CodecError):
            c.decode_message(buf[:cut])


def test_specific_rejections():
    good = c.encode_hard_state(HardState(1, 2, 3))
    with pytest.raises(c.CodecError, match="version"):
        c.decode_hard_state(b"\x09" + good[1:])
    with pytest.raises(c.CodecError, match="kind"):
        c.decode_entry(good)
    with pytest.raises(c.CodecError, match="trailing"):
        c.decode_hard_state(good + b"\x00")
    with pytest.raises(c.CodecError, match="2\\*\\*63"):
        c.decode_hard_state(good[:2] + struct.pack(">QQQ", 1 << 63, 0, 0))
    # unsorted voter IDs
    bad = bytes((1, c.RecordKind.CONF_STATE, 0)) + struct.pack(">HQQ", 2, 5, 3) + b"\x00\x00" * 3 + b"\x00" * 4
    with pytest.raises(c.CodecError, match="increasing"):
        c.decode_conf_state(bad)
    # a removed ID that is still a voter
    with pytest.raises(c.CodecError):
        c.encode_conf_state(ConfState(voters=(0,)))
    overlap = c.encode_conf_state(ConfState(voters=(1,), removed=(2,))).replace(
        struct.pack(">Q", 2), struct.pack(">Q", 1))
    with pytest.raises(c.CodecError, match="removed"):
        c.decode_conf_state(overlap)
    # a count far beyond the remaining bytes is rejected before allocating
    huge = bytearray(c.encode_message(Message(MessageType.APP)))
    huge[-4:] = struct.pack(">I", 99_999)
    with pytest.raises(c.CodecError):
        c.decode_message(bytes(huge))
    with pytest.raises(c.CodecError):
        c.decode_entry(bytes((1, 1, 7)) + b"\x00" * 20)  # unknown entry type


def test_limits_on_encode():
    with pytest.raises(c.CodecError):
        c.encode_message(Message(MessageType.APP, context=b"x" * (c.MAX_CONTEXT_BYTES + 1)))
    with pytest.raises(c.CodecError):
        c.encode_hard_state(HardState(term=-1))
    with pytest.raises(c.CodecError):
        c.encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, 0))
