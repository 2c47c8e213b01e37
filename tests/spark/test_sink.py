"""write / writeStream .format("xraft"): rows become XADD field/value pairs, and a chunk, task or
micro-batch applied twice adds nothing (the (query, partition) commit marker)."""
import os

import pytest

from xraft.spark.options import WriteOptions
from xraft.spark.sink import ChunkWriter, SinkError, marker_key, row_fields
from xraft.client.slots import key_slot

from tests.spark.conftest import sdk, seeds


def test_batch_write_adds_each_row_once(spark, xcluster):
    c = sdk(xcluster)
    try:
        df = spark.range(0, 1234, numPartitions=3).selectExpr("id", "cast(id * 2 as string) as twice",
                                                                "map('k', 'v') as extra", "null as nothing")
        (df.write.format("xraft").option("seeds", seeds(xcluster)).option("stream", "out:batch")
         .option("chunkSize", "100").mode("append").save())
        entries = c.xrange("out:batch")
        assert len(entries) == 1234
        got = sorted((int(e.fields_dict[b"id"]), e.fields_dict) for e in entries)
        assert [i for i, _ in got] == list(range(1234))
        assert got[7][1] == {b"id": b"7", b"twice": b"14", b"k": b"v"}
        assert c.execute("KEYS", "*xraft-sink*", key="out:batch") == []     # the job's markers deleted
    finally:
        c.close()


def test_chunk_applied_twice_adds_nothing(xcluster):
    c = sdk(xcluster)
    opts = WriteOptions.parse({"seeds": seeds(xcluster), "stream": "out:twice"})
    marker = marker_key("out:twice", "q1", 0)
    rows = [{"n": str(i)} for i in range(10)]
    try:
        w = ChunkWriter(opts, marker, 5)
        assert w.write(0, rows) is True
        assert w.write(0, rows) is False               # the same (batch, chunk): skipped
        assert ChunkWriter(opts, marker, 4).write(3, rows) is False   # an older batch too
        assert w.write(1, rows) is True
        w.close()
        assert c.xlen("out:twice") == 20
        assert c.execute("GET", marker) == b"5:1"
    finally:
        c.close()


def test_chunk_writer_follows_redirects(xcluster):
    """Started at every node in turn (two of them do not lead the stream's group: MOVED or
    NOTLEADER), each chunk lands once."""
    c = sdk(xcluster)
    opts = WriteOptions.parse({"seeds": seeds(xcluster), "stream": "out:moved"})
    try:
        for chunk, node in enumerate(xcluster.nodes.values()):
            w = ChunkWriter(opts, marker_key("out:moved", "q", 0), 1)
            w.address = node.resp
            assert w.write(chunk, [{"chunk": str(chunk)}]) is True
            w.close()
        assert [e.fields_dict[b"chunk"] for e in c.xrange("out:moved")] == [b"0", b"1", b"2"]
    finally:
        c.close()


def test_stream_sink_replayed_batch_adds_nothing(spark, xcluster, tmp_path):
    """A micro-batch run again (its commit mark dropped, as after a crash before the commit)
    writes its rows once: the target equals the source, entry for entry."""
    c = sdk(xcluster)
    ckpt = str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("xraft").option("seeds", seeds(xcluster)).option("streams", "copy:src")
             .option("maxEntriesPerTrigger", "70").load()
             .selectExpr("id as src_id", "fields")
             .writeStream.format("xraft").option("seeds", seeds(xcluster)).option("stream", "copy:dst")
             .option("chunkSize", "25").option("checkpointLocation", ckpt).start())
        q.processAllAvailable()
        q.stop()
        assert q.exception() is None

    try:
        c.xadd_batch("copy:src", [{"i": str(i)} for i in range(200)])
        run()
        commits = sorted(int(n) for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit())
        assert len(commits) >= 3
        for name in (str(commits[-1]), ".%d.crc" % commits[-1]):
            os.remove(os.path.join(ckpt, "commits", name))
        c.xadd_batch("copy:src", [{"i": str(i)} for i in range(200, 250)])
        run()
        src = [(str(e.id), e.fields_dict[b"i"]) for e in c.xrange("copy:src")]
        dst = sorted((e.fields_dict[b"src_id"].decode(), e.fields_dict[b"i"]) for e in c.xrange("copy:dst"))
        assert len(dst) == 250 and dst == sorted(src)
    finally:
        c.close()


def test_wrongtype_fails_the_task_with_the_error(spark, xcluster):
    c = sdk(xcluster)
    try:
        c.execute("SET", "out:string", "x")
        with pytest.raises(Exception, match="WRONGTYPE"):
            (spark.range(3).write.format("xraft").option("seeds", seeds(xcluster)).option("stream", "out:string")
             .option("timeout", "5").mode("append").save())
    finally:
        c.close()


def test_marker_key_in_the_stream_slot_and_row_fields():
    for stream in ("plain", "with:{tag}:x", "{a}b"):
        assert key_slot(marker_key(stream, "q", 3).encode()) == key_slot(stream.encode())
    with pytest.raises(SinkError, match="hash tag"):
        marker_key("odd{}name", "q", 0)
    assert row_fields(["a", "b", "m"], [1, None, {"x": b"\x01", "y": None}]) == {"a": "1", "x": b"\x01"}
