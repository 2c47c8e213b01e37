"""A stream record sent as a delta against an older copy of it (slot move pre-copy).

A move pre-copies a slot's keys to the target B while the source A still serves them, then
seals A and copies again. A big stream written meanwhile changed only at its end: XADD
appends to the last listpack node or adds nodes; the nodes before stay byte-identical unless
XDEL/XTRIM/DEL touched them. So the second copy of such a stream is a DELTA record: the
stream's full record with its leading nodes left out, plus a sha256 of the left-out bytes;
B rebuilds the full record from the nodes of its pre-copied record (if their digest matches)
and the delta. Only bytes are moved: no entry is decoded on either side.

Full record (dump.py "record", stream payload stream_codec.py, entries stream.dump_entries):

    tag 3 | key_len u32 | key | payload_len u32 | payload | crc32 u32
    payload = "XSTR" | ver u8 | entries_len u32 | entries | rest (groups, idmp, ...) | crc32 u32
    entries = header (73 bytes; its node count is the stream's) | nodes | crc32 u32
    node    = master id (16) | lp_len u32 | listpack

Delta record (same framing, its own tag; never stored, never loaded by dump.py):

    DELTA_TAG | key_len u32 | key | payload_len u32 | payload | crc32 u32
    payload = from_node (16) | prefix_nodes u32 | prefix_digest (32) | a stream payload
              whose entries hold the full header and only the nodes >= from_node

B answers a delta that does not fit its copy (another prefix, no copy) with DeltaMismatch;
the caller sends that key in full. The rebuilt record is the byte-exact full record A would
send, so the move's manifest digest still checks the result.
"""
from __future__ import annotations

import hashlib
import struct
import zlib

from .dump import TAG_STREAM

DELTA_TAG = 0x44                  # "D": not a dump codec tag
MIN_DELTA_RECORD_BYTES = 64 << 10  # a smaller pre-copied stream is simply sent again in full

_U32 = struct.Struct(">I")
_FRAME = struct.Struct(">BI")                 # tag, key_len
_STREAM_HEAD = struct.Struct(">4sBI")         # "XSTR", version, entries_len
_ENTRIES_HEAD = struct.Struct(">4sBQQQQQQQQI")  # stream.py _DUMP_HEADER; the last field is the node count
_NODE = struct.Struct(">16sI")
_DELTA_HEAD = struct.Struct(">16sI32s")       # from_node, prefix_nodes, prefix_digest


class DeltaMismatch(ValueError):
    """A delta that cannot be applied to the copy at hand (or bytes that are not one)."""


def split_record(raw: bytes) -> tuple:
    """(tag, key, payload) of one framed record; DeltaMismatch if the framing or crc is bad."""
    if len(raw) < _FRAME.size + 8:
        raise DeltaMismatch("record too short")
    tag, key_len = _FRAME.unpack_from(raw, 0)
    pos = _FRAME.size + key_len
    if pos + 8 > len(raw):
        raise DeltaMismatch("key runs past the record")
    key = raw[_FRAME.size:pos]
    (plen,) = _U32.unpack_from(raw, pos)
    if pos + 4 + plen + 4 != len(raw):
        raise DeltaMismatch("payload length does not match the record")
    if zlib.crc32(memoryview(raw)[:-4]) != _U32.unpack_from(raw, len(raw) - 4)[0]:
        raise DeltaMismatch("record checksum mismatch for key %r" % key[:64])
    return tag, key, raw[pos + 4:pos + 4 + plen]


def frame(tag: int, key: bytes, payload: bytes) -> bytes:
    body = b"".join((_FRAME.pack(tag, len(key)), key, _U32.pack(len(payload)), payload))
    return body + _U32.pack(zlib.crc32(body))


def _nodes(entries: bytes) -> list:
    """[(master id, start, end)] of the nodes in an entries section (offsets into it)."""
    if len(entries) < _ENTRIES_HEAD.size + 4:
        raise DeltaMismatch("stream entries too short")
    pos, end, out = _ENTRIES_HEAD.size, len(entries) - 4, []
    while pos < end:
        if pos + _NODE.size > end:
            raise DeltaMismatch("stream node header runs past the entries")
        mid, lp_len = _NODE.unpack_from(entries, pos)
        nxt = pos + _NODE.size + lp_len
        if nxt > end or (out and mid <= out[-1][0]):
            raise DeltaMismatch("stream nodes run past the entries or are out of order")
        out.append((mid, pos, nxt))
        pos = nxt
    return out


def _split_stream_payload(payload: bytes) -> tuple:
    """(version byte, entries, rest) of a stream payload; rest excludes the payload crc."""
    if len(payload) < _STREAM_HEAD.size + 4:
        raise DeltaMismatch("stream payload too short")
    magic, version, elen = _STREAM_HEAD.unpack_from(payload, 0)
    start = _STREAM_HEAD.size
    if magic != b"XSTR" or start + elen > len(payload) - 4:
        raise DeltaMismatch("not a stream payload")
    return version, payload[start:start + elen], payload[start + elen:-4]


def _stream_payload(version: int, entries: bytes, rest: bytes) -> bytes:
    body = b"".join((_STREAM_HEAD.pack(b"XSTR", version, len(entries)), entries, rest))
    return body + _U32.pack(zlib.crc32(body))


def last_node(record: bytes):
    """The master id of the last node of a full stream record (what B tells A it holds), or
    None when the record is not a stream worth a delta."""
    if len(record) < MIN_DELTA_RECORD_BYTES:
        return None
    try:
        tag, _, payload = split_record(record)
        if tag != TAG_STREAM:
            return None
        _, entries, _ = _split_stream_payload(payload)
        nodes = _nodes(entries)
    except DeltaMismatch:
        return None
    return nodes[-1][0] if nodes else None


def delta_record(full: bytes, from_node: bytes) -> bytes:
    """The DELTA record of the full stream record `full` against a copy whose nodes before
    `from_node` are A's (A side). `full` must be a stream record dump.py wrote."""
    _, key, payload = split_record(full)
    version, entries, rest = _split_stream_payload(payload)
    nodes = _nodes(entries)
    cut = next((i for i, (mid, _, _) in enumerate(nodes) if mid >= from_node), len(nodes))
    split_at = nodes[cut][1] if cut < len(nodes) else len(entries) - 4
    prefix = memoryview(entries)[_ENTRIES_HEAD.size:split_at]
    tail_entries = entries[:_ENTRIES_HEAD.size] + entries[split_at:]     # its crc is not checked
    head = _DELTA_HEAD.pack(from_node, cut, hashlib.sha256(prefix).digest())
    return frame(DELTA_TAG, key, head + _stream_payload(version, tail_entries, rest))


def apply_delta(delta: bytes, base) -> tuple:
    """(key, full record) rebuilt from a DELTA record and `base`, the full record B holds for
    that key (None: none). DeltaMismatch when base does not have the delta's prefix."""
    tag, key, payload = split_record(delta)
    if tag != DELTA_TAG or len(payload) < _DELTA_HEAD.size:
        raise DeltaMismatch("not a delta record")
    if base is None:
        raise DeltaMismatch("no pre-copied record for key %r" % key[:64])
    from_node, prefix_nodes, prefix_digest = _DELTA_HEAD.unpack_from(payload, 0)
    version, tail_entries, rest = _split_stream_payload(payload[_DELTA_HEAD.size:])
    btag, bkey, bpayload = split_record(base)
    if btag != TAG_STREAM or bkey != key:
        raise DeltaMismatch("the pre-copied record of key %r is not that stream" % key[:64])
    _, base_entries, _ = _split_stream_payload(bpayload)
    base_nodes = _nodes(base_entries)
    kept = [n for n in base_nodes if n[0] < from_node]
    split_at = kept[-1][2] if kept else _ENTRIES_HEAD.size
    prefix = memoryview(base_entries)[_ENTRIES_HEAD.size:split_at]
    if len(kept) != prefix_nodes or hashlib.sha256(prefix).digest() != prefix_digest:
        raise DeltaMismatch("the pre-copy of key %r changed before its last node" % key[:64])
    tail = _nodes(tail_entries)
    if any(mid < from_node for mid, _, _ in tail):
        raise DeltaMismatch("a delta node before its first node")
    body = tail_entries[:_ENTRIES_HEAD.size] + bytes(prefix) + tail_entries[_ENTRIES_HEAD.size:-4]
    entries = body + _U32.pack(zlib.crc32(body))
    return key, frame(TAG_STREAM, key, _stream_payload(version, entries, rest))
