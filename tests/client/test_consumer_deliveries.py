"""ConsumerSession's delivery decoding (its fast construction of StreamID and
StreamEntry) gives the same values as the types' own constructors."""
from xraft.client.aio import ConsumerSession, Delivery
from xraft.client.types import StreamEntry, StreamID
from xraft.proto.v1 import client_pb2 as pb


def test_deliveries_are_ordinary_stream_entries():
    msg = pb.ConsumeResponse()
    s = msg.delivery.streams.add(key=b"k")
    e = s.entries.add()
    e.id.ms, e.id.seq = 5, 7
    e.fields.add(name=b"a", value=b"1")
    e.fields.add(name=b"a", value=b"2")
    d = s.entries.add(deleted=True)
    d.id.ms = 6
    s2 = msg.delivery.streams.add(key=b"k2")
    s2.entries.add().id.seq = 1
    session = ConsumerSession(None, pb.ConsumeStart(keys=[b"k", b"k2"], group=b"g", consumer=b"c"))
    out = session._deliveries(msg.delivery.streams)
    want = [(b"k", StreamEntry(StreamID(5, 7), ((b"a", b"1"), (b"a", b"2")))),
            (b"k", StreamEntry(StreamID(6, 0), (), deleted=True)),
            (b"k2", StreamEntry(StreamID(0, 1)))]
    assert [(x.key, x.entry) for x in out] == want
    for x, (_, entry) in zip(out, want):
        assert type(x) is Delivery and x.session is session
        assert type(x.entry) is StreamEntry and type(x.id) is StreamID
        assert hash(x.entry) == hash(entry) and repr(x.entry) == repr(entry)
        assert x.entry.fields_dict == entry.fields_dict
        assert str(x.id) == str(entry.id)
    # The same entries again (a reconnect's replay) while still held: skipped.
    assert session._deliveries(msg.delivery.streams) == []
    session._held[b"k"].discard(StreamID(5, 7))        # its ack was confirmed
    assert [x.id for x in session._deliveries(msg.delivery.streams)] == [StreamID(5, 7)]
