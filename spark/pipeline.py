"""The example pipeline (`./dev pipeline`): sensor readings -> windowed aggregates, exactly once,
through a Spark job killed -9 and restarted from its checkpoint and a leader killed -9.

    python -m xraft.spark.pipeline [--dir DIR] [--keep] [--one-kill]   (what `./dev pipeline` runs)

1. a local 3-node cluster with 3 Raft groups (xraft.ops.local_cluster);
2. a producer XADDs readings {sensor, value} of four sensors to sensors:{eu} and
   sensors:{us} (SDK; the stream ID's milliseconds are the reading's event time);
3. a Spark Structured Streaming job (its own process: `... pipeline job`) reads
   sensors:{*}, takes event time from the ID, sets a watermark, and counts / sums /
   takes min and max of each sensor's values per one-second window, appended to the
   xraft stream sensors:agg (the exactly-once sink) and to Parquet files;
4. the job is killed -9 and restarted from its checkpoint; then the leader of
   sensors:{eu}'s group is killed -9 while the job runs, and restarted;
5. the producer stops, and one more reading per stream a few seconds later moves
   the watermark past every earlier window; once both outputs hold every window the
   watermark has closed, the check compares them with the same aggregates recomputed
   from XRANGE: equal, each window exactly once.
Exit status 0 only if both outputs are exact.
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from xraft.client import sync
from xraft.ops import local_cluster as lc

STREAMS = {"sensors:{eu}": ("greenhouse", "cellar"), "sensors:{us}": ("attic", "garage")}
PATTERN = "sensors:{*}"
AGG = "sensors:agg"
WINDOW_MS = 1000
DELAY_MS = 3000                      # the watermark's delay
PRODUCE_EVERY_S = 0.02
WAIT_S = 600                         # for each stage of the job (a loaded machine is slow)
MAX_JOB_STARTS = 8
MAX_QUERY_RESTARTS = 20


def say(t0, msg):
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


# -- the Spark job (its own process, so that it can be killed -9) ---------------------------------

def run_job(seeds: str, work: str) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from xraft.spark import XraftDataSource
    spark = (SparkSession.builder.master("local[2]").appName("xraft-pipeline")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(XraftDataSource)
    readings = (spark.readStream.format("xraft").option("seeds", seeds).option("streams", PATTERN).load()
                .select(F.timestamp_millis("ms").alias("event_time"), F.col("fields")["sensor"].alias("sensor"),
                        F.col("fields")["value"].cast("long").alias("value"))
                .withWatermark("event_time", f"{DELAY_MS} milliseconds"))
    agg = (readings.groupBy(F.window("event_time", f"{WINDOW_MS} milliseconds"), "sensor")
           .agg(F.count("*").alias("count"), F.sum("value").alias("sum"), F.min("value").alias("min"),
                F.max("value").alias("max"))
           .select(F.unix_millis(F.col("window.start")).alias("window_ms"), "sensor", "count", "sum", "min", "max"))
    starts = {
        "xraft": lambda: (agg.writeStream.format("xraft").option("seeds", seeds).option("stream", AGG)
                          .outputMode("append").option("checkpointLocation", os.path.join(work, "ckpt", "xraft"))
                          .trigger(processingTime="500 milliseconds").start()),
        "parquet": lambda: (agg.writeStream.format("parquet").option("path", os.path.join(work, "parquet"))
                            .option("checkpointLocation", os.path.join(work, "ckpt", "parquet"))
                            .outputMode("append").trigger(processingTime="500 milliseconds").start()),
    }
    supervise(spark, starts)


def supervise(spark, starts: dict) -> None:
    """Run the queries; one that fails is restarted from its checkpoint, up to MAX_QUERY_RESTARTS
    times, as a job supervisor would (on a loaded machine Spark gives up on a Python worker that
    takes more than 10 s to start). Each query is started once the previous one ran a batch:
    starting them together doubles the Python start-up that can time out."""
    running, restarts = {}, 0
    for name, start in starts.items():
        running[name] = start()
        while running[name].isActive and running[name].lastProgress is None:
            time.sleep(0.2)
        print(f"query {name} running: {running[name].id}", flush=True)
    while True:
        try:
            spark.streams.awaitAnyTermination()
        except Exception as e:  # noqa: BLE001 - printed; the query is restarted below
            print(f"a query failed: {str(e).splitlines()[0]}", flush=True)
        spark.streams.resetTerminated()
        for name, q in list(running.items()):
            if not q.isActive:
                restarts += 1
                if restarts > MAX_QUERY_RESTARTS:
                    raise RuntimeError(f"queries failed {restarts} times")
                print(f"restarting query {name} from its checkpoint", flush=True)
                running[name] = starts[name]()


class Job:
    def __init__(self, seeds: str, work: str):
        self.seeds, self.work, self.proc, self.starts = seeds, work, None, 0
        self.unplanned = 0                   # restarts after the job died by itself

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.work, f"job-{self.starts}.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "xraft.spark.pipeline", "job", "--seeds", self.seeds,
                                      "--work", self.work], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def kill(self):
        """SIGKILL the job's process group: the Python driver and the JVM it started."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def log_has(self, text: str) -> bool:
        """Whether the current start's log holds `text`."""
        with open(os.path.join(self.work, f"job-{self.starts}.log"), "rb") as f:
            return text.encode() in f.read()

    def check_alive(self, t0):
        """Restart the job from its checkpoint if it died on its own, as a supervisor would
        (on a loaded machine Spark gives up on a Python worker that starts in more than 10 s)."""
        if self.proc.poll() is None:
            return
        if self.starts >= MAX_JOB_STARTS:
            raise RuntimeError(f"the Spark job exited ({self.proc.returncode}) {self.starts} times; "
                               f"see {self.work}/job-{self.starts}.log")
        say(t0, f"the Spark job exited by itself ({self.proc.returncode}, job-{self.starts}.log): "
                "restarting it from its checkpoint")
        self.unplanned += 1
        self.start()


# -- producer, outputs, recomputation ------------------------------------------------------------

class Producer(threading.Thread):
    def __init__(self, seeds: list):
        super().__init__(daemon=True)
        self.client = sync.Client(seeds, timeout=30)
        self.stop_event = threading.Event()
        self.written = 0
        self.failed = 0

    def run(self):
        rng = random.Random(7)
        while not self.stop_event.is_set():
            batches = {s: [{"sensor": name, "value": str(rng.randint(0, 1000))} for name in sensors]
                       for s, sensors in STREAMS.items()}
            for key, result in self.client.xadd_multi(batches).items():
                if isinstance(result, Exception):
                    self.failed += 1       # counted; the check recomputes from what the streams hold
                else:
                    self.written += len(result)
            time.sleep(PRODUCE_EVERY_S)


def recompute(client) -> dict:
    """{(window ms, sensor): (count, sum, min, max)} over every reading in the streams (XRANGE),
    for the windows the final watermark (the latest event time - DELAY_MS) has closed: those
    Spark appends. (The last readings' windows stay open; no window ends near the watermark.)"""
    out = {}
    entries = [e for s in STREAMS for e in client.xrange(s)]
    watermark = max(e.id.ms for e in entries) - DELAY_MS
    for e in entries:
        if e.id.ms - e.id.ms % WINDOW_MS + WINDOW_MS > watermark:
            continue
        f = e.fields_dict
        sensor = f[b"sensor"].decode()
        v = int(f[b"value"])
        key = (e.id.ms - e.id.ms % WINDOW_MS, sensor)
        c, total, lo, hi = out.get(key, (0, 0, v, v))
        out[key] = (c + 1, total + v, min(lo, v), max(hi, v))
    return out


def xraft_rows(client) -> list:
    rows = []
    for e in client.xrange(AGG):
        f = {k.decode(): v.decode() for k, v in e.fields}
        rows.append(((int(f["window_ms"]), f["sensor"]),
                     (int(f["count"]), int(f["sum"]), int(f["min"]), int(f["max"]))))
    return rows


def parquet_rows(path: str) -> list:
    """The rows of the Parquet sink's committed files: those its _spark_metadata log lists
    (a file written by a killed batch and never committed is not part of the output)."""
    import pyarrow.parquet as pq
    files = set()
    for log in glob.glob(os.path.join(path, "_spark_metadata", "*")):
        if os.path.basename(log).startswith("."):
            continue
        with open(log) as f:
            for line in f.read().splitlines()[1:]:          # after the "v1" header
                entry = json.loads(line)
                if entry.get("action") == "add":
                    files.add(entry["path"].removeprefix("file://").removeprefix("file:"))
    rows = []
    for name in sorted(files):
        for r in pq.read_table(name).to_pylist():
            rows.append(((r["window_ms"], r["sensor"]), (r["count"], r["sum"], r["min"], r["max"])))
    return rows


def compare(name: str, rows: list, expected: dict) -> list:
    problems = []
    keys = [k for k, _ in rows]
    dup = len(keys) - len(set(keys))
    if dup:
        problems.append(f"{name}: {dup} window(s) written more than once")
    got = dict(rows)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
    if missing:
        problems.append(f"{name}: {len(missing)} window(s) missing, e.g. {missing[:3]}")
    if extra:
        problems.append(f"{name}: {len(extra)} window(s) not in the streams, e.g. {extra[:3]}")
    if wrong:
        k = wrong[0]
        problems.append(f"{name}: {len(wrong)} window(s) differ, e.g. {k}: {got[k]} != {expected[k]}")
    return problems


def wait_for(what: str, cond, job: Job, t0, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.check_alive(t0)
        if cond():
            say(t0, what)
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for: {what}")


# -- the run -----------------------------------------------------------------------------------------

def run(dir_: str, leader_kill: bool = True) -> int:
    t0 = time.monotonic()
    say(t0, f"local cluster in {dir_}")
    cluster = lc.up(os.path.join(dir_, "cluster"), 3, groups=3, timeout=60)
    seeds = [n.grpc for n in cluster.nodes]
    client = sync.Client(seeds, timeout=30)
    job = Job(",".join(seeds), dir_)
    producer = Producer(seeds)
    try:
        producer.start()
        job.start()
        say(t0, "producer and Spark job started")
        wait_for("the job wrote its first aggregates", lambda: client.xlen(AGG) >= 8, job, t0)
        job.kill()
        time.sleep(1)                       # a chunk sent just before the kill may still be applied
        seen = client.xlen(AGG)
        say(t0, f"Spark job killed -9 after {seen} aggregates; restarting it from its checkpoint")
        job.start()
        wait_for("the restarted job writes again", lambda: job.log_has("query xraft running")
                 and client.xlen(AGG) >= seen + 8, job, t0)
        if leader_kill:
            victim = next(n for n in cluster.nodes if n.grpc == client.leader_for("sensors:{eu}"))
            lc.kill(os.path.join(dir_, "cluster"), victim.id, "KILL")
            seen = client.xlen(AGG)
            say(t0, f"killed -9 node {victim.id}, the leader of sensors:{{eu}}'s group")
            wait_for("the job goes on through the failover", lambda: client.xlen(AGG) >= seen + 8, job, t0)
            lc.up(os.path.join(dir_, "cluster"), 3, timeout=60)
            say(t0, f"node {victim.id} restarted from disk")
        producer.stop_event.set()
        producer.join(60)
        time.sleep((DELAY_MS + 2 * WINDOW_MS) / 1000)
        # One more reading per stream, well after the others: the watermark passes every earlier window.
        client.xadd_multi({s: [{"sensor": sensors[0], "value": "0"}] for s, sensors in STREAMS.items()})
        expected = recompute(client)
        say(t0, f"producer stopped: {producer.written} readings ({producer.failed} failed calls); "
                f"{len(expected)} windows expected")
        wait_for("every window in sensors:agg", lambda: len(xraft_rows(client)) >= len(expected), job, t0)
        wait_for("every window in Parquet", lambda: len(parquet_rows(os.path.join(dir_, "parquet")))
                 >= len(expected), job, t0)
        problems = compare("sensors:agg", xraft_rows(client), expected)
        problems += compare("parquet", parquet_rows(os.path.join(dir_, "parquet")), expected)
        for p in problems:
            say(t0, "FAIL " + p)
        if not problems:
            say(t0, f"OK: sensors:agg and Parquet hold the {len(expected)} windows recomputed from XRANGE, "
                    f"each exactly once ({job.starts} job starts, {job.unplanned} of them after the job died "
                    "by itself)")
        return 1 if problems else 0
    finally:
        producer.stop_event.set()
        job.kill()
        client.close()
        lc.down(os.path.join(dir_, "cluster"), timeout=10)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="xraft.spark.pipeline", description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", default="run", choices=("run", "job"))
    p.add_argument("--dir", help="work directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--one-kill", action="store_true",
                   help="only the Spark job's kill -9 and restart, no leader kill (the shorter run)")
    p.add_argument("--seeds", help="job mode: the cluster's gRPC addresses")
    p.add_argument("--work", help="job mode: the work directory")
    args = p.parse_args(argv)
    if args.mode == "job":
        run_job(args.seeds, args.work)
        return 0
    dir_ = args.dir or tempfile.mkdtemp(prefix="xraft-pipeline-")
    try:
        return run(dir_, leader_kill=not args.one_kill)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(dir_, ignore_errors=True)
        else:
            print(f"work directory kept: {dir_}")


if __name__ == "__main__":
    sys.exit(main())
