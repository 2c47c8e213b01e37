"""Leader side of a chunked snapshot: a window of chunks in flight per follower.

A snapshot travels as MsgSnaps of at most `max_snapshot_chunk_bytes`, each with
its byte range (chunk_offset, chunk_total) and the metadata. Sending every chunk
at once (what this module replaced) put the whole image into the transport's
queue: an image larger than the queue's byte limit was refused as a whole, again
at every retry, so a follower behind a compacted log never caught up once the
state passed 64 MiB (bench/scale.py's catch-up at 10M entries).

    leader                                   follower (raft.SnapshotReceiver)
    SNAP [0,c) [c,2c) ... up to the window -->  stores each chunk by offset
           <-- SNAP_STATUS ack (chunk_offset = prefix: it holds [0, prefix))
    SNAP next chunks while next - acked < max_snapshot_inflight_bytes
    SNAP last chunk --------------------------> restore; APP_RESP (index)

`SnapshotSend` per follower: the snapshot (its data may be a lazy view of a
file, read a chunk at a time), `next` (first byte not sent yet) and `acked`
(the follower's prefix). Lost chunks: a follower rejection (a gap at the last
chunk) or a transport failure takes the progress back to PROBE, and the next
attempt of the SAME snapshot resumes from `acked`; a chunk lost without a report
shows as no ack progress between two heartbeat responses, and the window is
sent again from `acked` (duplicates are ignored by offset).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..invariant import invariant
from .progress import ProgressState
from .types import Message, MessageType as MT, Snapshot

if TYPE_CHECKING:
    from .raft import Raft


class SnapshotSend:
    __slots__ = ("snap", "next", "acked", "acked_at_beat")

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap  # Invariant: not empty; len(snap.data) <= codec MAX_SNAPSHOT_DATA_BYTES
        self.next = 0  # first data byte not sent yet. Invariant: acked <= next <= len(data)
        self.acked = 0  # the follower holds [0, acked), by its latest chunk ack
        self.acked_at_beat = -1  # `acked` at the previous heartbeat response (stall detection)


def start(r: "Raft", to: int, snap: Snapshot) -> None:
    """Send `snap` to `to` (its progress just became SNAPSHOT): from the start, or from the
    follower's acknowledged prefix when this is another attempt at the same snapshot."""
    if len(snap.data) == 0:  # an empty image travels as one empty chunk, installed at once
        r.snap_sends.pop(to, None)
        r.send(Message(MT.SNAP, to=to, snapshot=Snapshot(snap.metadata, b""), chunk_offset=0, chunk_total=0))
        return
    out = r.snap_sends.get(to)
    if out is None or out.snap.metadata != snap.metadata or len(out.snap.data) != len(snap.data):
        out = r.snap_sends[to] = SnapshotSend(snap)
    else:
        out.snap = snap
        out.next = out.acked
    out.acked_at_beat = -1
    _send_window(r, to, out)


def _send_window(r: "Raft", to: int, out: SnapshotSend) -> None:
    data = out.snap.data
    total = len(data)
    step = r.cfg.max_snapshot_chunk_bytes
    window = r.cfg.max_snapshot_inflight_bytes
    while out.next < total and out.next - out.acked < window:
        off = out.next
        chunk = bytes(data[off:off + step])
        invariant(len(chunk) > 0, "a snapshot chunk carries data")
        r.send(Message(MT.SNAP, to=to, snapshot=Snapshot(out.snap.metadata, chunk),
                       chunk_offset=off, chunk_total=total))
        out.next = off + len(chunk)


def note_holds(r: "Raft", m: Message) -> "SnapshotSend | None":
    """A follower's SNAP_STATUS with a range (an ack, or a rejection of a broken transfer):
    it holds [0, m.chunk_offset) of the snapshot at m.index. The SnapshotSend it is about,
    or None (an older attempt or snapshot)."""
    out = r.snap_sends.get(m.frm)
    if out is None or out.snap.metadata.index != m.index or m.chunk_total != len(out.snap.data):
        return None
    # The follower's latest word, even when lower: a follower that restarted (or started this
    # snapshot over) holds less than it acknowledged before, and a leader that kept the higher
    # mark would never send it the bytes below (the simulator's seeds 123 and 9652151). A
    # reordered older ack only costs a resend.
    out.acked = m.chunk_offset  # <= chunk_total == len(data): codec-checked
    out.next = max(out.next, out.acked)
    return out


def on_ack(r: "Raft", m: Message, pr) -> None:
    """A follower's chunk ack: send what the window now allows."""
    out = note_holds(r, m)
    if out is not None and pr.state == ProgressState.SNAPSHOT:
        _send_window(r, m.frm, out)


def on_heartbeat_response(r: "Raft", frm: int, pr) -> None:
    """No ack progress since the last heartbeat response while chunks are out: some were
    lost without a report; send the window again from what the follower holds."""
    out = r.snap_sends.get(frm)
    if pr.state != ProgressState.SNAPSHOT or out is None or out.next <= out.acked:
        return
    if out.acked == out.acked_at_beat:
        out.next = out.acked
        _send_window(r, frm, out)
    out.acked_at_beat = out.acked


def forget(r: "Raft", to: int) -> None:
    """The follower left SNAPSHOT state (installed, or moved on): drop what was held for it."""
    r.snap_sends.pop(to, None)
