"""The stream loader's cache of validated nodes (stream.py _check_node_cached): a node met
again is not validated again, and its answer is the one the check gave; bytes that differ in
any way are checked afresh, so damage is still caught."""
import struct
import zlib

import pytest

from tests.redis_oracle import engine_call
from xraft.node.engine import stream as stream_mod
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.stream import CorruptStream, Stream

NODE = struct.Struct(">16sI")


def _entries():
    db = Keyspace()
    for i in range(1, 400):
        engine_call(db, "XADD", "s", "%d-1" % i, "f", "v%d" % i, now_ms=1)
    return db.get(b"s").dump_entries()


def test_a_cached_node_loads_the_same_and_a_damaged_one_is_still_refused(monkeypatch):
    buf = _entries()
    first = Stream.load_entries(buf)
    checks = []
    real = stream_mod._check_node
    monkeypatch.setattr(stream_mod, "_check_node", lambda k, lp: checks.append(k) or real(k, lp))
    again = Stream.load_entries(buf)
    assert checks == [] and list(again.iter_range()) == list(first.iter_range())
    assert again.length == first.length == 399
    # the first node's listpack with a damaged element count, the dump's crc made valid again
    body = bytearray(buf[:-4])
    pos = 73 + NODE.size + 4                      # past the header, the node header, lp total bytes
    body[pos] ^= 0x7F
    with pytest.raises(CorruptStream):
        Stream.load_entries(bytes(body) + struct.pack(">I", zlib.crc32(bytes(body))))
    assert len(checks) == 1


def test_the_cache_is_bounded_by_bytes(monkeypatch):
    monkeypatch.setattr(stream_mod, "NODE_CACHE_BYTES", 64 * 2000)
    stream_mod._checked_nodes.clear()
    monkeypatch.setattr(stream_mod, "_checked_bytes", 0)
    Stream.load_entries(_entries())
    assert 0 < stream_mod._checked_bytes <= 64 * 2000
    assert stream_mod._checked_bytes == sum(len(k) + len(lp) for k, lp in stream_mod._checked_nodes)
