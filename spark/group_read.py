"""Consumer-group mode of the streaming read (options group + consumer): at least once.

    latestOffset  XREADGROUP GROUP g c ... STREAMS s <start[s]>  (this consumer's
                  pending entries after the last batch: delivered before a crash
                  and never committed), then XREADGROUP ... > for new entries, up to
                  the trigger's budget; the offset is the last ID taken per stream.
                  Delivery happens here, on the driver, so the batch's entries are
                  in the consumer's PEL before any task runs.
    partitions    (start[s], end[s]] per stream, read by the tasks as the consumer's
                  history (XREADGROUP with an ID: its own pending entries, in order),
                  so a batch replayed after a restart reads the same entries again.
    commit(end)   XACK every entry of the consumer pending at or below end[s]: entries
                  are acknowledged only once Spark has committed the batch. Spark signals
                  commit(end) of a batch when it plans the next one, so the last batch of a
                  run would stay pending until new data came: latestOffset(start) therefore
                  acknowledges up to `start` first (Spark calls it only with the end of a
                  batch it has committed; a batch replayed after a restart runs before it).
    initialOffset (a query without a checkpoint) creates the group where missing
                  (XGROUP CREATE ... MKSTREAM at `start`), and claims the pending entries
                  of the group's other consumers idle for claimMinIdleMs (XAUTOCLAIM): a
                  crashed query's entries are delivered again to its successor, which
                  starts at offset 0-0 and so reads its whole PEL first.

Poison entries (options maxDeliveries + deadLetterStream): prepare() sets the
group's XRAFT.GROUPCFG policy when the query starts using a stream. The server
counts a delivery for the driver's XREADGROUP > and for every task read of the
batch (a history read); the read that would exceed maxDeliveries instead moves
the entry to the dead-letter stream and acknowledges it, atomically, and leaves
it out of the reply: a batch replayed too often loses those entries to the
dead-letter stream instead of producing them again.

A query killed before commit leaves its batch pending; restarted from its
checkpoint it replays the batch from the PEL and acknowledges it then, so an
entry may be processed twice (at least once), never lost. Entries deleted
while pending (XDEL) are skipped and acknowledged with their batch.
"""
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from xraft.client.errors import BusyGroupError
from xraft.client.types import StreamID

from .batch_read import read_pages
from .ids import ZERO, prev_id, shares
from .options import DEFAULT_GROUP_BATCH, ReadOptions

CLAIM_PAGE = 1000
ACK_PAGE = 1000


@dataclass(frozen=True)
class GroupPartition(InputPartition):
    """This consumer's pending entries of one stream with lo < id <= hi."""
    stream: str
    lo: StreamID
    hi: StreamID


def _entries(reply: dict, stream: str) -> list:
    return reply.get(stream.encode(), reply.get(stream, []))


def ensure_group(client, opts: ReadOptions, stream: str) -> None:
    first = "$" if opts.from_latest else str(prev_id(opts.start))
    try:
        client.xgroup_create(stream, opts.group, id=first, mkstream=True)
    except BusyGroupError:
        pass


def prepare(client, opts: ReadOptions, stream: str) -> None:
    """The group exists on `stream`, with the query's dead-letter policy when it has one."""
    ensure_group(client, opts, stream)
    if opts.max_deliveries is not None:
        client.xgroup_cfg(stream, opts.group, opts.max_deliveries, opts.dead_letter_key(stream))


def initial(client, opts: ReadOptions, streams) -> dict:
    """Claims the idle pending entries of the group's other consumers (groups prepared first)."""
    for s in streams:
        start = "0-0"
        while True:
            res = client.xautoclaim(s, opts.group, opts.consumer, opts.claim_min_idle_ms, start,
                                    count=CLAIM_PAGE, justid=True)
            if res.next_start == ZERO:
                break
            start = str(res.next_start)
    return {s: ZERO for s in streams}


def latest(client, opts: ReadOptions, streams, begun: dict, budget) -> dict:
    """The next offset (groups prepared first)."""
    total = budget if budget is not None else DEFAULT_GROUP_BATCH * len(streams)
    commit(client, opts, begun)        # the batches up to `start` are committed (module doc)
    out, spare = {}, 0
    for s, share in zip(streams, shares(total, len(streams))):
        lo = begun.get(s, ZERO)
        share += spare
        taken = []
        if share:
            taken = _entries(client.xreadgroup(opts.group, opts.consumer, {s: str(lo)}, count=share), s)
        if len(taken) < share:
            taken += _entries(client.xreadgroup(opts.group, opts.consumer, {s: ">"}, count=share - len(taken)), s)
        spare = share - len(taken)
        out[s] = max([lo] + [e.id for e in taken])
    return out


def pending_pages(client, opts: ReadOptions, part: GroupPartition):
    """Pages of the consumer's pending entries lo < id <= hi, deleted ones left out."""
    after = part.lo
    while after < part.hi:
        got = _entries(client.xreadgroup(opts.group, opts.consumer, {part.stream: str(after)}, count=opts.page),
                       part.stream)
        inside = [e for e in got if e.id <= part.hi]
        yield [e for e in inside if not e.deleted]
        if len(inside) < len(got):
            return
        after = got[-1].id if got else after
        if len(got) < opts.page and not (opts.max_deliveries and _pending_after(client, opts, part, after)):
            return                         # a short page ends the range, unless dead letters shortened it


def _pending_after(client, opts: ReadOptions, part: GroupPartition, after: StreamID) -> bool:
    """Whether the consumer still has entries pending in (after, hi]: entries dead-lettered
    by a history read count against its COUNT but are left out of its reply (and acknowledged)."""
    return bool(client.xpending_range(part.stream, opts.group, "(" + str(after), str(part.hi), count=1,
                                      consumer=opts.consumer))


def read_partition(opts: ReadOptions, part: GroupPartition):
    """Arrow batches of the consumer's pending entries lo < id <= hi (runs in an executor)."""
    return read_pages(opts, part.stream, lambda client: pending_pages(client, opts, part))


def commit(client, opts: ReadOptions, end: dict) -> None:
    for s, hi in end.items():
        while True:
            pending = client.xpending_range(s, opts.group, "-", str(hi), count=ACK_PAGE, consumer=opts.consumer)
            if not pending:
                break
            client.xack(s, opts.group, *[p.id for p in pending])
