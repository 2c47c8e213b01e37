"""Streaming read: spark.readStream.format("xraft"), exactly once through Spark's checkpoint.

The offset is the last ID taken per stream, as JSON: {"sensors:eu": "1700000000000-3", ...}
(sorted by stream name; an ID is "ms-seq"). A micro-batch (start, end] is read
with XRANGE (start[s], end[s]] per stream: the ranges depend on the two offsets
only, so a query restarted from its checkpoint replays a planned batch with
exactly the same rows (entries deleted meanwhile excepted), and a batch never
overlaps the next one.

latestOffset re-resolves the stream patterns on every trigger: a new matching
stream joins with everything it holds (from the beginning). maxEntriesPerTrigger
(ReadMaxRows) caps the entries per batch, shared evenly among the streams with
new entries; without it a batch takes everything up to each stream's last entry.
The `start` option picks the first batch's position ("-" or an ID bound: from
there; "latest" or "$": after the entries present when the query starts); `end`
caps every stream's offset.

Consumer-group mode (options group + consumer) is group_read.py: the offsets
have the same form, but entries come from XREADGROUP and are acknowledged at commit.
"""
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from xraft.client.types import StreamID

from . import cluster, group_read
from .batch_read import RangePartition, read_partition
from .ids import ZERO, from_offset, next_id, prev_id, shares, to_offset
from .options import ReadOptions

class StreamReader(DataSourceStreamReader):
    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self._client = None                # the driver's client, made on first use
        self._prepared = set()             # group mode: streams whose group and policy are set

    @property
    def client(self):
        if self._client is None:
            self._client = cluster.open_client(self.opts.conn)
        return self._client

    def _streams(self) -> list:
        return cluster.resolve_streams(self.client, self.opts.names, self.opts.patterns)

    def _prepare_groups(self, streams) -> None:
        """Group mode: create the group and set its dead-letter policy once per stream and query."""
        for s in streams:
            if s not in self._prepared:
                group_read.prepare(self.client, self.opts, s)
                self._prepared.add(s)

    def _new_stream_start(self) -> StreamID:
        """The offset of a stream seen for the first time after the first batch: all of it
        (from `start`)."""
        return prev_id(self.opts.start)

    # -- offsets (driver) -------------------------------------------------------------------

    def initialOffset(self) -> dict:
        streams = self._streams()
        if self.opts.group is not None:
            self._prepare_groups(streams)
            return to_offset(group_read.initial(self.client, self.opts, streams))
        ids = {}
        for s in streams:
            if self.opts.from_latest:
                ids[s] = cluster.last_id(self.client, s) or ZERO
            else:
                ids[s] = self._new_stream_start()
        return to_offset(ids)

    def getDefaultReadLimit(self):
        if self.opts.max_per_trigger is not None:
            return ReadMaxRows(self.opts.max_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        begun = from_offset(start)
        streams = sorted(set(begun) | set(self._streams()))
        if not streams:
            return to_offset(begun)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self.opts.group is not None:
            self._prepare_groups(streams)
            return to_offset(group_read.latest(self.client, self.opts, streams, begun, budget))
        out = {}
        spare = 0
        quota = shares(budget, len(streams)) if budget is not None else [None] * len(streams)
        for s, share in zip(streams, quota):
            lo = begun.get(s, self._new_stream_start())
            if share is None:
                last = cluster.last_id(self.client, s)
                hi = max(lo, last) if last is not None else lo
            else:
                share += spare             # what earlier streams did not use
                entries = self.client.xrange(s, "(" + str(lo), "+", count=share) if share else []
                spare = share - len(entries)
                hi = entries[-1].id if entries else lo
            out[s] = max(lo, min(hi, self.opts.end))
        return to_offset(out)

    def partitions(self, start: dict, end: dict):
        begun, upto = from_offset(start), from_offset(end)
        if self.opts.group is not None:
            self._prepare_groups(sorted(upto))  # a batch replayed after a restart is planned here first
        parts = []
        for s in sorted(upto):
            lo = begun.get(s, self._new_stream_start())
            hi = upto[s]
            if hi <= lo:
                continue
            if self.opts.group is not None:
                parts.append(group_read.GroupPartition(s, lo, hi))
            else:
                parts.append(RangePartition(s, next_id(lo), hi))
        return parts

    def commit(self, end: dict) -> None:
        if self.opts.group is not None:
            group_read.commit(self.client, self.opts, from_offset(end))

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- executors -----------------------------------------------------------------------------

    def read(self, partition):
        if isinstance(partition, group_read.GroupPartition):
            return group_read.read_partition(self.opts, partition)
        return read_partition(self.opts, partition)

    def __getstate__(self):
        # The reader is pickled to the executors: without the driver's client (a thread and a loop).
        state = dict(self.__dict__)
        state["_client"] = None
        return state
