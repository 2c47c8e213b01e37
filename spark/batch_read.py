"""Batch read: spark.read.format("xraft") -> the entries of the matching streams in an ID range.

Partitions: one per stream, and a long stream (more than entriesPerPartition
entries) is cut into ID ranges by millisecond time, evenly between its first
and last entry, so its pages are read by several tasks at once. The cut is
planned from XINFO STREAM (length, first and last entry) on the driver; each
task then reads its range with XRANGE pages (pageSize entries per call) from
the leader of the stream's group (followers with followerReads=true).
"""
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceReader, InputPartition

from xraft.client.types import MAX_U64, StreamID

from . import cluster
from .options import ReadOptions
from .rows import arrow_schema, to_batch


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Entries lo <= id <= hi of one stream (both StreamIDs, inclusive)."""
    stream: str
    lo: StreamID
    hi: StreamID


def split_range(stream: str, lo: StreamID, hi: StreamID, length: int, per_partition: int) -> list:
    """[lo, hi] of a stream with about `length` entries, as ranges of about
    `per_partition` entries if the entries were spread evenly over time.
    Cuts fall on millisecond boundaries, so every ID in [lo, hi] is in
    exactly one range (a burst in one millisecond stays in one range)."""
    parts = max(1, min(-(-length // per_partition), hi.ms - lo.ms + 1))
    if parts == 1:
        return [RangePartition(stream, lo, hi)]
    step = (hi.ms - lo.ms + 1) / parts
    cuts = sorted({lo.ms + int(step * i) for i in range(1, parts)} - {lo.ms})
    out, start = [], lo
    for cut in cuts:
        out.append(RangePartition(stream, start, StreamID(cut - 1, MAX_U64)))
        start = StreamID(cut, 0)
    out.append(RangePartition(stream, start, hi))
    return out


def plan(client, opts: ReadOptions, streams) -> list:
    """The partitions of a batch read of `streams` within [opts.start, opts.end]."""
    out = []
    for stream in streams:
        bounds = cluster.id_bounds(client, stream)
        if bounds is None:
            continue
        first, last, length = bounds
        lo, hi = max(first, opts.start), min(last, opts.end)
        if lo > hi:
            continue
        out.extend(split_range(stream, lo, hi, length, opts.entries_per_partition))
    return out


def read_pages(opts: ReadOptions, stream: str, pages):
    """Arrow batches of the entry pages `pages(client)` yields for `stream`, on a client of
    this task's own (runs in an executor)."""
    schema = arrow_schema(opts.binary)
    slot = cluster.slot_of(stream)
    client = cluster.open_client(opts.conn)
    try:
        for entries in pages(client):
            if entries:
                yield to_batch(stream, slot, entries, schema, opts.binary)
    finally:
        client.close()


def read_partition(opts: ReadOptions, part: RangePartition):
    """Arrow batches of one range partition (runs in an executor)."""
    return read_pages(opts, part.stream,
                      lambda client: cluster.read_range(client, part.stream, part.lo, part.hi, opts.page))


class BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions):
        self.opts = opts

    def partitions(self):
        client = cluster.open_client(self.opts.conn)
        try:
            streams = cluster.resolve_streams(client, self.opts.names, self.opts.patterns)
            parts = plan(client, self.opts, streams)
        finally:
            client.close()
        # Spark needs at least one partition; an empty range reads nothing.
        return parts or [RangePartition("", StreamID(1, 0), StreamID(0, 0))]

    def read(self, partition):
        if partition.lo > partition.hi:
            return iter(())
        return read_partition(self.opts, partition)
