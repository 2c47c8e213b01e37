"""Spark connector benchmark: xraft.spark read and write beside the SDK in one process, same run.

    python bench/spark.py [--quick] [--json FILE] [--entries N] [--dir DIR]

A local 3-node cluster (3 Raft groups, ops.local_cluster) and a local[2]
SparkSession (this machine has 2 cores). Four streams (one hash tag each, so
they spread over the groups) get --entries entries in all.

* sdk_write_entries_per_s: one sync SDK client writing N entries to one stream,
  xadd_batch of 500 after 500 (the Spark sink writes to one stream too, so both
  go through one Raft group's leader);
* spark_write_entries_per_s: spark.range(N) with the same fields, written with
  .format("xraft") to one stream (chunkSize 500: one WATCH/MULTI/EXEC per chunk,
  two tasks at once), after a small warm-up write (JVM, workers);
* sdk_preload_entries_per_s (context): the preload of the four read streams,
  xadd_multi of 500 entries per stream per call (their groups' leaders in parallel);
* sdk_read_entries_per_s: one sync SDK client, XRANGE pages of 1000, stream by stream;
* spark_read_entries_per_s: spark.read.format("xraft") of the four streams into
  the "noop" sink (every row materialised, nothing written), after a warm-up read.
Load average is printed and stored: other work on the machine depresses every figure.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from xraft.client import sync  # noqa: E402
from xraft.ops import local_cluster as lc  # noqa: E402

STREAMS = ["bench:{a}", "bench:{b}", "bench:{c}", "bench:{d}"]
OUT = "bench:{out}"
BATCH = 500


def fields(i: int) -> dict:
    return {"sensor": f"sensor-{i % 64}", "value": str(i % 1000), "unit": "celsius"}


def sdk_write_one(client, total: int) -> float:
    t = time.perf_counter()
    for start in range(0, total, BATCH):
        for r in client.xadd_batch("bench:{sdkout}", [fields(start + i) for i in range(min(BATCH, total - start))]):
            if isinstance(r, Exception):
                raise r
    return total / (time.perf_counter() - t)


def sdk_preload(client, total: int) -> float:
    per_stream = total // len(STREAMS)
    t = time.perf_counter()
    for start in range(0, per_stream, BATCH):
        n = min(BATCH, per_stream - start)
        results = client.xadd_multi({s: [fields(start + i) for i in range(n)] for s in STREAMS})
        for r in results.values():
            if isinstance(r, Exception):
                raise r
    return per_stream * len(STREAMS) / (time.perf_counter() - t)


def sdk_read(client) -> tuple:
    t = time.perf_counter()
    n = 0
    for s in STREAMS:
        lo = "-"
        while True:
            page = client.xrange(s, lo, "+", count=1000)
            n += len(page)
            if len(page) < 1000:
                break
            lo = "(" + str(page[-1].id)
    return n, n / (time.perf_counter() - t)


def session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from xraft.spark import XraftDataSource
    spark = (SparkSession.builder.master("local[2]").appName("xraft-bench")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(XraftDataSource)
    return spark


def spark_read(spark, seeds: str, per_partition: int) -> tuple:
    def load():
        return (spark.read.format("xraft").option("seeds", seeds).option("streams", "bench:{[abcd]}")
                .option("entriesPerPartition", str(per_partition)).load())
    load().limit(10).collect()                                    # warm-up: JVM, Python workers
    df = load()
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - t
    return df.rdd.getNumPartitions(), elapsed


def spark_write(spark, seeds: str, total: int) -> float:
    def frame(n):
        return spark.range(0, n, numPartitions=2).selectExpr(
            "concat('sensor-', cast(id % 64 as string)) as sensor", "cast(id % 1000 as string) as value",
            "'celsius' as unit")
    writer = (lambda df, stream: df.write.format("xraft").option("seeds", seeds).option("stream", stream)
              .option("chunkSize", str(BATCH)).mode("append").save())
    writer(frame(1000), "bench:{warm}")
    df = frame(total)
    t = time.perf_counter()
    writer(df, OUT)
    return total / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 entries instead of 200,000")
    p.add_argument("--entries", type=int, help="entries written and read by each side")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--dir", help="cluster directory (default: a temporary one, removed)")
    args = p.parse_args(argv)
    total = args.entries or (20_000 if args.quick else 200_000)
    dir_ = args.dir or tempfile.mkdtemp(prefix="xraft-bench-spark-")
    load_start = os.getloadavg()
    cluster = lc.up(os.path.join(dir_, "cluster"), 3, groups=3, timeout=60)
    seeds = [n.grpc for n in cluster.nodes]
    client = sync.Client(seeds, timeout=60)
    spark = None
    try:
        preload = sdk_preload(client, total)
        print(f"SDK preload   {preload:10,.0f} entries/s  ({total:,} entries in 4 streams, xadd_multi of {BATCH} "
              "per stream)")
        sdk_w = sdk_write_one(client, total)
        print(f"SDK write     {sdk_w:10,.0f} entries/s  ({total:,} entries to one stream, xadd_batch of {BATCH})")
        read_n, sdk_r = sdk_read(client)
        print(f"SDK read      {sdk_r:10,.0f} entries/s  ({read_n:,} entries, XRANGE pages of 1000)")
        spark = session()
        parts, elapsed = spark_read(spark, ",".join(seeds), max(1, read_n // 8))
        spark_r = read_n / elapsed
        print(f"Spark read    {spark_r:10,.0f} entries/s  ({parts} partitions; {spark_r / sdk_r:.2f}x the SDK)")
        spark_w = spark_write(spark, ",".join(seeds), total)
        print(f"Spark write   {spark_w:10,.0f} entries/s  (2 tasks, chunks of {BATCH}; {spark_w / sdk_w:.2f}x the SDK)")
        assert client.xlen(OUT) == total, "the Spark write did not add each row exactly once"
        load_end = os.getloadavg()
        print(f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end")
        figures = {"spark_read_entries_per_s": round(spark_r), "sdk_read_entries_per_s": round(sdk_r),
                   "spark_write_entries_per_s": round(spark_w), "sdk_write_entries_per_s": round(sdk_w),
                   "sdk_preload_entries_per_s": round(preload), "entries": total, "read_ratio": round(spark_r / sdk_r, 3),
                   "write_ratio": round(spark_w / sdk_w, 3), "load_avg_start": load_start[0],
                   "load_avg_end": load_end[0]}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=2)
        return 0
    finally:
        if spark is not None:
            spark.stop()
        client.close()
        lc.down(os.path.join(dir_, "cluster"), timeout=10)
        if not args.dir:
            shutil.rmtree(dir_, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
