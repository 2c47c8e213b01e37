"""Transport: how a node's Raft groups reach the same groups on other nodes.

A node sends BATCHES: one batch carries messages of any number of groups, all
to the same peer node, as (group_id, Message) pairs. MultiRaft builds at most
one batch per peer per loop iteration (bounded by max batch bytes), so the
per-send cost (a gRPC write, a syscall) is paid once for all groups.

Delivery promises are Raft's: a batch may be lost, delayed or (across
reconnects) duplicated; within one link (sender -> receiver) batches are not
reordered. The transport never raises into the sender's loop:

  * send() returns False when the batch was refused on the spot (peer known to
    be down, link queue full) — the caller reports the peer unreachable;
  * a batch accepted and then lost in a way the transport *learns about* (a
    stream broke, the peer went away) is handed back through
    TransportHandler.unreachable(), so the sender can report_unreachable()
    and report_snapshot(.., False) (a leader waits forever for a snapshot
    whose failure nobody reports);
  * silent loss (a packet dropped on the floor) is allowed and handled by
    Raft's retries.

What a receiver accepts from an authenticated peer is one rule,
raft.types.link_violation (GrpcTransport ends the stream on a violation, the
Raft simulator's network fails the seed): messages addressed to the receiver,
from the peer itself — except forwarded proposals, ReadIndex and transfer
requests, which keep their originator in `frm` (the leader answers a read to
the node holding it) and may arrive over the link of a node that passed them on.

LocalTransport is the in-process implementation: drivers in one process (one
event loop) exchange batches through loop.call_soon / call_later, with
injectable faults for tests: partitions, down nodes, random loss, latency,
and an optional encode/decode round trip through the wire codec so nothing
unserializable can hide behind object passing.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from ..raft.codec import decode_message, encode_message
from ..raft.types import Message

log = logging.getLogger("xraft.transport")

Batch = Sequence[tuple[int, Message]]  # (group_id, message); every message to the same peer node


class TransportHandler(Protocol):
    """What a transport calls on the node that owns it (in the node's event loop thread)."""

    def deliver(self, from_node: int, batch: Batch) -> None:
        """A batch arrived from `from_node`."""
        ...

    def unreachable(self, peer: int, lost: Batch) -> None:
        """A batch this node sent to `peer` is known lost (after send() returned True)."""
        ...


class Transport(Protocol):
    node_id: int

    def start(self, handler: TransportHandler) -> None:
        """Begin delivering incoming batches to `handler`."""
        ...

    def send(self, to_node: int, batch: Batch) -> bool:
        """Hand `batch` over for delivery without blocking; False = refused now (peer unreachable)."""
        ...

    async def close(self) -> None:
        """Stop sending and receiving; batches still queued to or from this node are dropped."""
        ...


@dataclass
class LinkStats:
    batches: int = 0  # accepted by send()
    messages: int = 0
    refused: int = 0  # send() returned False
    dropped: int = 0  # accepted, then lost (random loss, or receiver gone)


class LocalNetwork:
    """The switch joining LocalTransports in one process; holds the fault injection knobs.

    Faults are per directed link (a -> b): `partition(a, b)` cuts both directions,
    `cut(a, b)` only a -> b. A cut link REFUSES sends (like a connection that
    cannot be established), which the sender hears about; `drop_rate` loses
    accepted batches SILENTLY (like packets on the floor).
    """

    def __init__(self, *, codec: bool = True, drop_rate: float = 0.0, latency_s: float = 0.0,
                 max_inflight_batches: int = 1024, seed: int = 0):
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f"drop_rate {drop_rate} not in [0, 1)")
        if latency_s < 0 or max_inflight_batches <= 0:
            raise ValueError("latency_s must be >= 0 and max_inflight_batches > 0")
        self.codec = codec
        self.drop_rate = drop_rate
        self.latency_s = latency_s
        # Bound on batches accepted but not yet delivered per link: a slow receiver
        # makes senders see refusals instead of growing memory without limit.
        self.max_inflight_batches = max_inflight_batches
        self.rng = random.Random(seed)
        self._nodes: dict[int, "LocalTransport"] = {}
        self._cut: set[tuple[int, int]] = set()
        self._inflight: dict[tuple[int, int], int] = {}
        self.stats: dict[tuple[int, int], LinkStats] = {}

    # ------------------------------------------------ fault injection

    def cut(self, a: int, b: int) -> None:
        self._cut.add((a, b))

    def partition(self, a: int, b: int) -> None:
        self._cut.add((a, b))
        self._cut.add((b, a))

    def isolate(self, n: int, others: Sequence[int]) -> None:
        for o in others:
            if o != n:
                self.partition(n, o)

    def heal(self) -> None:
        self._cut.clear()

    # ------------------------------------------------ plumbing

    def _register(self, t: "LocalTransport") -> None:
        old = self._nodes.get(t.node_id)
        if old is not None and not old.closed:
            raise ValueError(f"node {t.node_id} already has an open transport")
        self._nodes[t.node_id] = t

    def _unregister(self, t: "LocalTransport") -> None:
        if self._nodes.get(t.node_id) is t:
            del self._nodes[t.node_id]

    def in_flight(self) -> int:
        """Batches accepted and not yet delivered (or dropped at arrival), over every link."""
        return sum(self._inflight.values())

    def link_stats(self, a: int, b: int) -> LinkStats:
        st = self.stats.get((a, b))
        if st is None:
            st = self.stats[(a, b)] = LinkStats()
        return st

    def _send(self, src: "LocalTransport", to: int, batch: Batch) -> bool:
        link = (src.node_id, to)
        st = self.link_stats(*link)
        dst = self._nodes.get(to)
        inflight = self._inflight.get(link, 0)
        if dst is None or dst.handler is None or link in self._cut or inflight >= self.max_inflight_batches:
            st.refused += 1
            return False
        st.batches += 1
        st.messages += len(batch)
        if self.drop_rate and self.rng.random() < self.drop_rate:
            st.dropped += 1
            return True  # silently lost
        if self.codec:
            # Round-trip through the wire codec: the receiver gets fresh objects built
            # from bytes, exactly what a socket would give it.
            batch = [(gid, decode_message(encode_message(m))) for gid, m in batch]
        else:
            batch = list(batch)
        self._inflight[link] = inflight + 1
        loop = asyncio.get_running_loop()
        if self.latency_s:
            loop.call_later(self.latency_s, self._arrive, src, dst, batch)
        else:
            loop.call_soon(self._arrive, src, dst, batch)
        return True

    def _arrive(self, src: "LocalTransport", dst: "LocalTransport", batch: list) -> None:
        link = (src.node_id, dst.node_id)
        self._inflight[link] -= 1
        # The receiver may have closed, or the link been cut, while the batch was in flight.
        if dst.closed or link in self._cut:
            self.link_stats(*link).dropped += 1
            if not src.closed and src.handler is not None:
                src.handler.unreachable(dst.node_id, batch)
            return
        dst.handler.deliver(src.node_id, batch)


class LocalTransport:
    """One node's endpoint on a LocalNetwork."""

    def __init__(self, network: LocalNetwork, node_id: int):
        if node_id <= 0:
            raise ValueError(f"node id {node_id} must be > 0")
        self.network = network
        self.node_id = node_id
        self.handler: Optional[TransportHandler] = None
        self.closed = False
        network._register(self)

    def start(self, handler: TransportHandler) -> None:
        if self.closed:
            raise RuntimeError(f"transport of node {self.node_id} is closed")
        self.handler = handler

    def send(self, to_node: int, batch: Batch) -> bool:
        if self.closed or not batch:
            return False
        return self.network._send(self, to_node, batch)

    async def close(self) -> None:
        self.closed = True
        self.handler = None
        self.network._unregister(self)
