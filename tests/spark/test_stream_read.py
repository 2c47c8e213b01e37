"""readStream.format("xraft"): each entry exactly once across a checkpoint restart (a planned
batch replays the same rows), new matching streams picked up, maxEntriesPerTrigger, and a
leader kill -9 mid-query changes nothing in the output."""
import os
import signal
import threading

import pytest

from xraft.spark.ids import shares

from tests.spark.conftest import sdk, seeds


class Recorder:
    """A foreachBatch sink that keeps every execution of every batch: {batch id: [rows]} per run,
    so a replayed batch can be compared with its first execution."""

    def __init__(self):
        self.runs = []                      # [(batch id, sorted [(stream, id)])] in execution order
        self.lock = threading.Lock()

    def __call__(self, df, batch_id):
        rows = sorted((r.stream, r.id) for r in df.select("stream", "id").collect())
        with self.lock:
            self.runs.append((batch_id, rows))

    def batches(self) -> dict:
        """The last execution of each batch."""
        return {b: rows for b, rows in self.runs}


def start(spark, cluster, ckpt, recorder, **options):
    r = spark.readStream.format("xraft").option("seeds", seeds(cluster))
    for k, v in options.items():
        r = r.option(k, v)
    return (r.load().writeStream.foreachBatch(recorder).option("checkpointLocation", ckpt)
            .trigger(processingTime="100 milliseconds").start())


def everything(c, streams) -> list:
    return sorted((s, str(e.id)) for s in streams for e in c.xrange(s))


def flat(batches: dict) -> list:
    return sorted(r for rows in batches.values() for r in rows)


def test_exactly_once_across_checkpoint_restart(spark, xcluster, tmp_path):
    c = sdk(xcluster)
    ckpt = str(tmp_path / "ckpt")
    try:
        for s in ("ev:1", "ev:2"):
            c.xadd_batch(s, [{"i": str(i)} for i in range(100)])
        rec = Recorder()
        q = start(spark, xcluster, ckpt, rec, streams="ev:*", maxEntriesPerTrigger="30")
        q.processAllAvailable()
        q.stop()
        first = rec.batches()
        assert all(len(rows) <= 30 for rows in first.values())
        assert flat(first) == everything(c, ["ev:1", "ev:2"])
        last = max(first)
        # Spark replays a batch planned but not committed: drop the last commit mark.
        for name in (str(last), ".%d.crc" % last):
            os.remove(os.path.join(ckpt, "commits", name))
        for s in ("ev:1", "ev:3"):         # ev:3 is new: picked up by the pattern
            c.xadd_batch(s, [{"i": str(i)} for i in range(50)])
        rec2 = Recorder()
        q = start(spark, xcluster, ckpt, rec2, streams="ev:*", maxEntriesPerTrigger="30")
        q.processAllAvailable()
        q.stop()
        assert rec2.runs[0] == (last, first[last])     # the replay: the same rows
        merged = {**first, **rec2.batches()}
        assert flat(merged) == everything(c, ["ev:1", "ev:2", "ev:3"])   # each entry exactly once
    finally:
        c.close()


def test_leader_kill_mid_query(spark, xcluster, tmp_path):
    c = sdk(xcluster)
    rec = Recorder()
    streams = ["kill:a", "kill:b", "kill:c"]
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set() and i < 600:
            c.xadd_multi({s: [{"i": str(i)}] for s in streams})
            i += 1

    try:
        for s in streams:
            c.xadd(s, {"i": "start"})
        q = start(spark, xcluster, str(tmp_path / "ckpt"), rec, streams="kill:*", maxEntriesPerTrigger="200")
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        q.processAllAvailable()
        victim = next(n for n in xcluster.nodes.values() if n.grpc == c.leader_for("kill:a"))
        victim.signal(signal.SIGKILL)
        victim.wait_exit()
        q.processAllAvailable()
        victim.start()
        stop.set()
        producer.join(60)
        q.processAllAvailable()
        q.stop()
        assert q.exception() is None
        got = [r for _, rows in rec.runs for r in rows]    # every execution: no batch ran twice here
        assert sorted(got) == everything(c, streams)
        assert len(got) == len(set(got))
    finally:
        stop.set()
        c.close()


def test_shares():
    assert shares(10, 3) == [4, 3, 3] and shares(2, 4) == [1, 1, 0, 0]
