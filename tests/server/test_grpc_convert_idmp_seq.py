"""grpc_convert.xadd_batch with XAddRequest.idempotent_id_first (client.proto): the
batch it builds means the same XADDs as the per-entry ids hex(first + i); entries
without fields leave it (their ids are skipped, the rest keep theirs); and what the
field cannot mean is refused."""
import pytest

from xraft.node.server import grpc_convert as cv
from xraft.proto.v1 import client_pb2 as pb

U64 = 2**64 - 1


def _request(n, first, without=(), per_entry=None):
    r = pb.XAddRequest(key=b"s", producer_id=b"p")
    for i in range(n):
        e = r.entries.add()
        if i not in without:
            e.fields.add(name=b"f", value=b"%d" % i)
        if per_entry is not None:
            e.idempotent_id = per_entry[i]
    if first is not None:
        r.idempotent_id_first = first
    return r


def test_first_is_the_seq_form_of_the_per_entry_ids():
    batch, without = cv.xadd_batch(_request(20, 0xf8))
    want, _ = cv.xadd_batch(_request(20, None, per_entry=[b"%x" % v for v in range(0xf8, 0xf8 + 20)]))
    assert without == [] and batch.idmp_first == 0xf8 and want.idmp_first is None
    assert (batch.idmp_pid, batch.idmp_iids, batch.entries) == (want.idmp_pid, want.idmp_iids, want.entries)
    assert len(batch.raw) < len(want.raw)


def test_entries_without_fields_keep_the_others_ids():
    batch, without = cv.xadd_batch(_request(5, 9, without={1, 3}))
    assert without == [1, 3] and batch.idmp_first is None
    assert batch.idmp_iids == (b"9", b"b", b"d")


def test_last_id_at_the_u64_edge():
    assert cv.xadd_batch(_request(2, U64 - 1))[0].idmp_iids == (b"fffffffffffffffe", b"ffffffffffffffff")
    with pytest.raises(cv.ArgumentError, match="past 2"):
        cv.xadd_batch(_request(2, U64))


def test_refused():
    with pytest.raises(cv.ArgumentError, match="needs producer_id"):
        cv.xadd_batch(pb.XAddRequest(key=b"s", entries=[pb.XAddEntry(fields=[pb.Field(name=b"f", value=b"v")])],
                                     idempotent_id_first=1))
    with pytest.raises(cv.ArgumentError, match="per-entry"):
        cv.xadd_batch(_request(2, 1, per_entry=[b"", b"x"]))
    r = _request(2, 1)
    r.entries[1].auto_seq_ms = 5
    with pytest.raises(cv.ArgumentError, match="auto-generated IDs"):
        cv.xadd_batch(r)
