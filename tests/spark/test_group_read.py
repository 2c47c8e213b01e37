"""Consumer-group mode (group + consumer options): XREADGROUP on the driver, XACK only when
Spark commits the batch. A clean run leaves an empty PEL; a crashed run's entries are
delivered again, from the checkpoint (its own PEL) or to a new consumer (claimed)."""
import pytest

from tests.cluster.conftest import wait_until
from tests.spark.conftest import sdk, seeds
from tests.spark.test_stream_read import Recorder

STREAMS = ("grp:1", "grp:2")


class Crash(Exception):
    pass


def crashing(df, batch_id):
    df.count()                              # the batch's tasks read the entries
    raise Crash("the sink fails before the batch commits")


def run(spark, cluster, ckpt, sink, consumer, pattern, expect_failure=False, per_trigger="80", **options):
    r = (spark.readStream.format("xraft").option("seeds", seeds(cluster)).option("streams", pattern)
         .option("group", "g").option("consumer", consumer).option("maxEntriesPerTrigger", per_trigger))
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load().writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
         .trigger(processingTime="100 milliseconds").start())
    if expect_failure:
        with pytest.raises(Exception, match="Crash"):
            q.awaitTermination(120)
        return
    q.processAllAvailable()
    return q


def pending(c, streams) -> int:
    return sum(c.xpending(s, "g").count for s in streams)


def everything(c, streams) -> list:
    return sorted((s, str(e.id)) for s in streams for e in c.xrange(s))


def test_clean_run_acks_everything(spark, xcluster, tmp_path):
    c = sdk(xcluster)
    try:
        for s in STREAMS:
            c.xadd_batch(s, [{"i": str(i)} for i in range(150)])
        rec = Recorder()
        q = run(spark, xcluster, str(tmp_path / "ckpt"), rec, "c1", "grp:*")
        wait_until(lambda: pending(c, STREAMS) == 0, 60, "every delivered entry acknowledged")
        q.stop()
        got = [r for _, rows in rec.runs for r in rows]
        assert sorted(got) == everything(c, STREAMS) and len(got) == len(set(got))
        assert all(len(rows) <= 80 for _, rows in rec.runs)
    finally:
        c.close()


def test_crashed_run_redelivers_from_checkpoint_and_to_a_new_consumer(spark, xcluster, tmp_path):
    c = sdk(xcluster)
    streams = ("crash:1",)
    try:
        c.xadd_batch("crash:1", [{"i": str(i)} for i in range(100)])
        run(spark, xcluster, str(tmp_path / "a"), crashing, "c1", "crash:*", expect_failure=True)
        held = pending(c, streams)
        assert held == 80                          # the first batch: delivered, never acknowledged
        # Restarted from its checkpoint: the planned batch is read again from c1's PEL.
        rec = Recorder()
        q = run(spark, xcluster, str(tmp_path / "a"), rec, "c1", "crash:*")
        wait_until(lambda: pending(c, streams) == 0, 60, "the replayed batch acknowledged")
        q.stop()
        got = [r for _, rows in rec.runs for r in rows]
        assert sorted(got) == everything(c, streams) and len(got) == 100

        # Crash again with new entries, then a new query (no checkpoint) under another consumer.
        c.xadd_batch("crash:1", [{"i": str(i)} for i in range(100, 150)])
        run(spark, xcluster, str(tmp_path / "b"), crashing, "c1", "crash:*", expect_failure=True)
        assert pending(c, streams) == 50
        rec2 = Recorder()
        q = run(spark, xcluster, str(tmp_path / "c"), rec2, "c2", "crash:*")
        wait_until(lambda: pending(c, streams) == 0, 60, "the claimed entries acknowledged")
        q.stop()
        got2 = sorted(r for _, rows in rec2.runs for r in rows)
        assert got2 == everything(c, streams)[100:]     # c1's 50 pending entries, claimed by c2
    finally:
        c.close()


class RecordThenCrash(Recorder):
    """Keeps the batch's rows (a sink that wrote part of them), then fails before the commit."""

    def __call__(self, df, batch_id):
        super().__call__(df, batch_id)
        raise Crash("the sink fails after writing the batch")


def test_poison_entries_go_to_the_dead_letter_stream(spark, xcluster, tmp_path):
    """maxDeliveries 3: the driver's delivery and one task read per execution of a batch count.
    After a crashed batch (2 deliveries) five of its entries are read once more by hand (3), so
    the replay dead-letters exactly those five (a 4th delivery) and reads the rest again."""
    c = sdk(xcluster)
    stream, dead = "{dl}:1", "{dl}:1:dead"
    policy = dict(maxDeliveries="3", deadLetterStream="<stream>:dead", pageSize="5")
    try:
        ids = [str(i) for i in c.xadd_batch(stream, [{"i": str(i)} for i in range(30)])]
        first = RecordThenCrash()
        ckpt = str(tmp_path / "ckpt")
        run(spark, xcluster, ckpt, first, "c1", stream, expect_failure=True, per_trigger="20", **policy)
        assert [rows for _, rows in first.runs] == [sorted((stream, i) for i in ids[:20])]
        poison = ids[5:10]
        got = c.xreadgroup("g", "c1", {stream: ids[4]}, count=5)          # their 3rd delivery
        assert [str(e.id) for e in got.get(stream.encode(), got.get(stream))] == poison

        rec = Recorder()
        q = run(spark, xcluster, ckpt, rec, "c1", stream, per_trigger="20", **policy)
        wait_until(lambda: pending(c, [stream]) == 0, 60, "every entry acknowledged or dead-lettered")
        q.stop()
        replayed = [r for _, rows in rec.runs for r in rows]
        # The replay skips the dead letters (a 5-entry page of them, then the read goes on).
        assert sorted(replayed) == sorted((stream, i) for i in ids if i not in poison)
        output = [r for _, rows in first.runs + rec.runs for r in rows]
        assert all(output.count((stream, i)) == 1 for i in poison)        # never produced again
        letters = list(c.dead_letters(dead))
        assert [str(d.source_id) for d in letters] == poison
        assert {(d.stream, d.group, d.consumer, d.deliveries) for d in letters} == {(stream.encode(), b"g", b"c1", 3)}
        assert [str(e.id) for e in c.xrange(stream)] == ids                 # the source keeps them
    finally:
        c.close()


def test_dead_letter_options_go_together():
    from xraft.spark.options import OptionError, ReadOptions
    base = {"seeds": "h:1", "streams": "{s}", "group": "g", "consumer": "c"}
    opts = ReadOptions.parse({**base, "maxDeliveries": "4", "deadLetterStream": "<stream>:dead"})
    assert opts.max_deliveries == 4 and opts.dead_letter_key("{s}") == "{s}:dead"
    with pytest.raises(OptionError, match="go together"):
        ReadOptions.parse({**base, "maxDeliveries": "4"})
    with pytest.raises(OptionError, match="outside 2"):
        ReadOptions.parse({**base, "maxDeliveries": "1", "deadLetterStream": "d"})
    with pytest.raises(OptionError, match="consumer-group mode"):
        ReadOptions.parse({"seeds": "h:1", "streams": "{s}", "maxDeliveries": "4", "deadLetterStream": "d"})
