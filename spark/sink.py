"""The writer, batch and streaming: rows -> XADD field/value pairs, exactly once.

A row becomes one entry of the `stream` option: each chosen column (`fields`,
default every column) is one field named after the column, its value as text
(bytes as they are; a map column gives its own name/value pairs; nulls are left
out). A task writes its partition in chunks of `chunkSize` rows.

Exactly once, by a commit marker (the cluster's replicated IDMP dedup was not
on main when this was written): each (query, partition) has a marker key in the
stream's slot, holding the last (batch id, chunk number) it wrote. A chunk is
one optimistic transaction on the RESP port of the slot's leader:

    WATCH marker; GET marker        -> already (batch, chunk) or later: skip the chunk
    MULTI; XADD stream * ... (one per row); SET marker "batch:chunk"; EXEC

MULTI/EXEC is one Raft log record, so the entries and the marker are applied
together or not at all, and WATCH (checked when the record is applied, on any
leader: docs/redis-differences.md) makes two attempts of the same chunk
exclusive: a retried task, a re-run micro-batch (after a failure or a restart
from the checkpoint), a speculative copy, or an EXEC resent after a failover
whose first attempt is still in the log. Whatever runs later sees the marker
and adds nothing. The idempotency key is thus (query id, batch id, partition,
row position // chunkSize), as in the design for IDMP; it assumes what Spark's
own exactly-once sinks assume: a re-run batch gives a partition the same rows
in the same order.

    query id    streaming: the query's id (kept in the checkpoint, the same after a
                restart); batch write: a random id made on the driver per write,
                whose markers the driver deletes once the job has committed
    batch id    streaming: the micro-batch id; batch write: 0
    marker key  "<stream>:xraft-sink:<query>:<partition>" if the stream name has a
                {hash tag}, else "{<stream>}:xraft-sink:<query>:<partition>"

A command that fails inside EXEC does not undo the others (redis's MULTI): so
the one error to expect, a key of another type, is checked under the WATCH
before MULTI (WRONGTYPE, nothing written).

Failures surface as Spark task failures carrying the error: SinkError (the
cluster's error text, e.g. WRONGTYPE), or the last retriable error once the
`timeout` option has run out (redirects, elections and lost connections are
retried until then).
"""
import random
import time
import uuid
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AskError, BusyLoadingError, ClusterDownError, TryAgainError
from redis.retry import Retry
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from xraft.client.errors import XRaftError
from xraft.client.slots import key_slot

from . import cluster
from .options import WriteOptions

MARKER = "xraft-sink"
# xraft's replies that mean "nothing was done here, go elsewhere or wait" (node/server/wire_errors.py)
# and that redis-py leaves as plain ResponseErrors, and UNKNOWNOUTCOME: the marker settles whether
# the attempt was applied.
RETRY_PREFIXES = ("NOTLEADER", "UNAVAILABLE", "BUSY ", "TIMEOUT", "UNKNOWNOUTCOME")
BACKOFF_S = (0.02, 1.0)
MAX_REDIRECTS = 8                    # redirects followed in a row before backing off


class SinkError(XRaftError):
    """The cluster refused a chunk (its reply says why), or retries ran out of time."""


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    written: int                      # entries added by this task
    skipped: int                      # entries of chunks an earlier attempt had written


def marker_key(stream: str, query: str, partition: int) -> str:
    """The (query, partition) marker, in the stream's slot (module doc)."""
    slot = key_slot(stream.encode())
    key = f"{stream}:{MARKER}:{query}:{partition}"
    if key_slot(key.encode()) != slot:
        key = "{%s}:%s:%s:%d" % (stream, MARKER, query, partition)
    if key_slot(key.encode()) != slot:
        raise SinkError(f"no marker key in the slot of stream {stream!r}; use a name without braces or with a "
                        "{hash tag}")
    return key


def parse_marker(value) -> tuple:
    if value is None:
        return (-1, -1)
    batch, _, chunk = (value.decode() if isinstance(value, bytes) else value).partition(":")
    return int(batch), int(chunk)


def row_fields(columns, row) -> dict:
    out = {}
    for name, value in zip(columns, row):
        if value is None:
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                if v is not None:
                    out[_text(k)] = _text(v)
        else:
            out[name] = _text(value)
    return out


def _text(v):
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class ChunkWriter:
    """Writes one task's chunks to the leader of the stream's slot over RESP, following it."""

    def __init__(self, opts: WriteOptions, marker: str, batch: int):
        self.opts, self.marker, self.batch = opts, marker, batch
        self.sdk = cluster.open_client(opts.conn)
        self.address = None               # RESP "host:port" of the leader
        self.conns: dict = {}

    def close(self):
        for r in self.conns.values():
            r.close()
        self.sdk.close()

    def _leader_resp(self) -> str:
        layout = self.sdk.cluster_layout()
        slot = key_slot(self.opts.stream.encode())
        group = next(g for g in layout.groups if any(lo <= slot <= hi for lo, hi in g.slots))
        by_id = {n.id: n for n in layout.nodes}
        node = by_id.get(group.leader) or by_id.get(group.preferred_leader) or layout.nodes[0]
        if not node.resp:
            raise SinkError(f"node {node.id} has no RESP address in the cluster layout")
        return node.resp

    def _conn(self) -> redis.Redis:
        if self.address is None:
            self.address = self._leader_resp()
        r = self.conns.get(self.address)
        if r is None:
            host, port = self.address.rsplit(":", 1)
            r = self.conns[self.address] = redis.Redis(
                host=host, port=int(port), password=self.opts.password, socket_timeout=self.opts.conn.timeout,
                socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))   # never a blind resend
        return r

    def write(self, chunk: int, entries: list) -> bool:
        """Write one chunk unless an earlier attempt did; True if this call added it."""
        deadline = time.monotonic() + self.opts.conn.timeout
        attempt = hops = 0
        while True:
            try:
                return self._attempt(chunk, entries)
            except redis.WatchError:
                continue                     # the marker moved: look again
            except (redis.ConnectionError, redis.TimeoutError) as e:
                last = e
                self.address = None
            except (AskError, TryAgainError, ClusterDownError, BusyLoadingError) as e:
                # redis-py's own classes for MOVED/ASK, TRYAGAIN, CLUSTERDOWN, LOADING (their
                # text has the prefix cut off); MOVED and ASK name the node to go to.
                last = e
                self.address = f"{e.host}:{e.port}" if isinstance(e, AskError) else None
                if self.address and hops < MAX_REDIRECTS:
                    hops += 1                # straight to the named node, no backoff
                    continue
            except redis.ResponseError as e:
                text = str(e)
                if not text.startswith(RETRY_PREFIXES):
                    raise SinkError(f"stream {self.opts.stream!r}: {text}") from e
                last = e
                parts = text.split()
                self.address = parts[1] if parts[0] == "NOTLEADER" and ":" in parts[-1] else None
                if self.address and hops < MAX_REDIRECTS:
                    hops += 1
                    continue
            hops = 0
            if time.monotonic() > deadline:
                raise SinkError(f"stream {self.opts.stream!r}: retries ran out of time; last error: {last}") from last
            base, cap = BACKOFF_S
            time.sleep(min(cap, base * 2 ** attempt) * random.uniform(0.5, 1.0))
            attempt += 1

    def _attempt(self, chunk: int, entries: list) -> bool:
        stream = self.opts.stream
        with self._conn().pipeline(transaction=True) as p:
            p.watch(self.marker)
            if parse_marker(p.get(self.marker)) >= (self.batch, chunk):
                p.unwatch()
                return False
            kind = p.type(stream)
            if kind not in (b"stream", b"none"):
                p.unwatch()
                raise SinkError(f"WRONGTYPE stream {stream!r} holds a {kind.decode()}, not a stream")
            p.multi()
            for fields in entries:
                p.xadd(stream, fields, maxlen=self.opts.maxlen, approximate=True)
            p.set(self.marker, f"{self.batch}:{chunk}")
            p.execute()
            return True


def write_partition(opts: WriteOptions, columns, rows, query: str, batch: int) -> SinkCommit:
    from pyspark import TaskContext
    partition = TaskContext.get().partitionId()
    names = list(opts.fields or columns)
    index = [columns.index(n) for n in names]
    writer = ChunkWriter(opts, marker_key(opts.stream, query, partition), batch)
    written = skipped = chunk = 0
    try:
        buf = []
        for row in rows:
            buf.append(row_fields(names, [row[i] for i in index]))
            if len(buf) == opts.chunk:
                n = len(buf)
                if writer.write(chunk, buf):
                    written += n
                else:
                    skipped += n
                chunk, buf = chunk + 1, []
        if buf:
            if writer.write(chunk, buf):
                written += len(buf)
            else:
                skipped += len(buf)
    finally:
        writer.close()
    return SinkCommit(partition, written, skipped)


def _check_columns(opts: WriteOptions, columns) -> None:
    missing = [f for f in (opts.fields or ()) if f not in columns]
    if missing:
        from .options import OptionError
        raise OptionError("fields", f"no such column(s): {', '.join(missing)} (columns: {', '.join(columns)})")


class BatchWriter(DataSourceWriter):
    def __init__(self, opts: WriteOptions, columns):
        _check_columns(opts, columns)
        self.opts, self.columns = opts, list(columns)
        self.query = "batch-" + uuid.uuid4().hex      # made once, on the driver: retried tasks share it

    def write(self, rows):
        return write_partition(self.opts, self.columns, rows, self.query, 0)

    def commit(self, messages) -> None:
        # Every task succeeded and none will run again: this job's markers are done with.
        # (xraft keeps no key expiry, so they are deleted here, not left to expire.)
        markers = [marker_key(self.opts.stream, self.query, m.partition) for m in messages
                   if isinstance(m, SinkCommit)]
        if markers:
            client = cluster.open_client(self.opts.conn)
            try:
                client.execute("DEL", *markers, key=markers[0])
            finally:
                client.close()

    def abort(self, messages) -> None:
        pass                                  # written chunks stay: a retried task skips them


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, opts: WriteOptions, columns):
        _check_columns(opts, columns)
        self.opts, self.columns = opts, list(columns)

    def write(self, rows):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        # Structured Streaming puts these on every task of a micro-batch.
        query, batch = ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            raise SinkError("no streaming query id / batch id in the task's properties")
        return write_partition(self.opts, self.columns, rows, query, int(batch))

    def commit(self, messages, batchId) -> None:
        pass                                  # the chunks are committed by the tasks themselves

    def abort(self, messages, batchId) -> None:
        pass                                  # written chunks stay: the batch's re-run skips them
