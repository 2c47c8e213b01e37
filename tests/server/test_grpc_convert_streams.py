"""grpc_convert.fill_streams (the Consume/XREADGROUP hot path) builds exactly
the messages streams_pb does, for every field count and deleted entries."""
import pytest

from xraft.node.engine.replies import NULL_ARRAY
from xraft.node.server import grpc_convert as cv
from xraft.proto.v1 import client_pb2 as pb


def _reply(nfields):
    entries = [[b"%d-%d" % (10 + i, i), [b"f%d" % k if k % 2 == 0 else b"v%d" % i for k in range(2 * nfields)]]
               for i in range(3)]
    entries.append([b"99-0", NULL_ARRAY])          # a history read's deleted entry
    entries.append([b"100", None])
    return [[b"s", entries], [b"empty", []], [b"t", entries[:1]]]


@pytest.mark.parametrize("nfields", [0, 1, 2, 3, 5])
def test_fill_streams_equals_streams_pb(nfields):
    reply = _reply(nfields)
    a = pb.ConsumeResponse()
    cv.fill_streams(a.delivery.streams, reply)
    b = pb.ConsumeResponse()
    b.delivery.streams.extend(cv.streams_pb(reply))
    assert a == b
    assert [len(e.fields) for e in a.delivery.streams[0].entries] == [nfields] * 3 + [0, 0]


def test_fill_streams_of_nothing():
    for reply in (NULL_ARRAY, None, []):
        out = pb.ConsumeResponse()
        cv.fill_streams(out.delivery.streams, reply)
        assert len(out.delivery.streams) == 0
