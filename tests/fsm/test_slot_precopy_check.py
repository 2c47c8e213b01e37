"""PRESTAGE's lighter check of a pre-copied chunk (engine/dump.py check_records): the same
records and the same refusals as load_records, except that a stream's groups and PELs are
not loaded, since every replica of the target checks the chunk at once and the sealed copy
loads the records in full anyway (bench/README.md, session 13)."""
import struct
import zlib

import pytest

from xraft.node.engine.dump import TAG_STREAM, CorruptDump, check_records, dump_record, load_records
from xraft.node.engine.replies import OK
from xraft.node.engine.stream_delta import _split_stream_payload, _stream_payload, frame, split_record
from xraft.node.fsm.slot_export import decode_have, manifest, staged_have
from xraft.node.fsm.slot_moves import END, encode_cursor

from .test_slot_moves import MOVING, M, NOW, cmd, group_a, group_b, step, views
from .test_slot_precopy import BIG, fill_big, sealed_copy


def chunk_of(a) -> bytes:
    """Every moving key's record, in key order (a chunk as the export cuts it)."""
    return b"".join(dump_record(k, a.keyspace.data[k]) for k in sorted(a.keyspace.data) if k in
                    {m.encode() for m in MOVING})


def with_stream_payload(record: bytes, entries_fn=lambda e: e, rest_fn=lambda r: r) -> bytes:
    """The stream record with its entries / rest (groups, idmp...) rewritten and every
    checksum made right again: damage only the checks past the checksums can see."""
    tag, key, payload = split_record(record)
    version, entries, rest = _split_stream_payload(payload)
    entries = entries_fn(entries)
    entries = entries[:-4] + struct.pack(">I", zlib.crc32(entries[:-4]))
    return frame(tag, key, _stream_payload(version, entries, rest_fn(rest)))


def test_check_records_gives_the_records_load_records_gives_for_strings_lists_and_streams():
    a = group_a()
    fill_big(a)
    cmd(a, "RPUSH %s x y z" % MOVING[1])
    chunk = chunk_of(a)
    checked = check_records(chunk)
    assert [k for k, _ in checked] == [k for k, _, _ in load_records(chunk)] and len(checked) == 3
    assert checked == [(k, raw) for k, _, raw in load_records(chunk)]
    assert b"".join(raw for _, raw in checked) == chunk


def test_check_records_refuses_damaged_framing_checksums_and_entries_as_load_records_does():
    a = group_a()
    fill_big(a)
    raw = dump_record(BIG.encode(), a.keyspace.data[BIG.encode()])
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x01                                   # the record's checksum fails
    # The entries' header claims one entry more than its nodes hold (checksums made right).
    longer = with_stream_payload(raw, entries_fn=lambda e: e[:5] + struct.pack(">Q", struct.unpack_from(
        ">Q", e, 5)[0] + 1) + e[13:])
    for bad in (bytes(flipped), raw[:-1], raw + b"\x00", longer):
        with pytest.raises(CorruptDump):
            load_records(bad)
        with pytest.raises(CorruptDump):
            check_records(bad)


def test_a_pre_copy_checks_a_streams_entries_not_its_groups_and_the_sealed_copy_still_loads_them():
    """A record whose checksums and entries check out but whose groups do not: the pre-copy
    takes it into B's base (nothing serves the base), and the move still ends with B equal
    to A, because the sealed copy's DELTA carries A's groups and is loaded in full."""
    a, b = group_a(), group_b()
    fill_big(a)
    raw = dump_record(BIG.encode(), a.keyspace.data[BIG.encode()])
    bad_groups = with_stream_payload(raw, rest_fn=lambda r: struct.pack(">I", 1 << 30) + r[4:])
    with pytest.raises(CorruptDump):
        load_records(bad_groups)
    assert check_records(bad_groups) == [(BIG.encode(), bad_groups)]
    start = encode_cursor(M.first, 0)
    assert step(b, "PRESTAGE", start, END, bad_groups) == 1
    assert b.moves.staging[M].base[BIG.encode()] == bad_groups
    before = views(a, NOW + 1000)
    assert step(a, "SEAL") == OK
    have = decode_have(staged_have(b, M))
    assert BIG.encode() in have
    sent = sealed_copy(a, b, have)
    assert 0 < sent < len(raw) // 2                               # it went as a delta
    assert step(b, "ACTIVATE", manifest(a, M)) == OK
    assert views(b, NOW + 1000)[:7] == before[:7]
    assert TAG_STREAM == raw[0]
