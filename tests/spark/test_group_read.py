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


def run(spark, cluster, ckpt, sink, consumer, pattern, expect_failure=False):
    q = (spark.readStream.format("xraft").option("seeds", seeds(cluster)).option("streams", pattern)
         .option("group", "g").option("consumer", consumer).option("maxEntriesPerTrigger", "80").load()
         .writeStream.foreachBatch(sink).option("checkpointLocation", ckpt)
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
