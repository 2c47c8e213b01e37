"""The simulated network: messages in flight with delays, loss, duplication, partitions.

Time is the simulator's step counter. A sent message gets a delivery time
`now + delay`; the scheduler delivers any one message whose time has come,
chosen at random, so messages are reordered both by their delays and by the
choice. Links are directed: a partition blocks (a, b) and (b, a), a one-way
partition only one of them. A blocked link, like loss, drops at delivery time,
so a message sent just before a partition is lost too (as on a real wire).

A message travels on the link of the node that sent it (`via`), which is not always
`msg.frm`: a forwarded proposal or ReadIndex keeps its originator there. Partitions
and loss reports follow the link; at delivery the simulator applies the transports'
acceptance rule (types.link_violation) to (via, receiver).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from xraft.node.raft.types import Message

MAX_IN_FLIGHT = 4000  # bound on queued messages; beyond it the oldest are lost


@dataclass(frozen=True)
class NetConfig:
    max_delay: int = 5  # steps a message may wait before it is deliverable
    drop_rate: float = 0.0  # chance a delivery is lost
    dup_rate: float = 0.0  # chance a delivery is also re-queued (delivered twice)


@dataclass
class InFlight:
    due: int
    seq: int  # send order, for the trace only
    msg: Message
    via: int  # the node whose link carries it (the sender of this hop)


class Network:
    def __init__(self, rng: random.Random, cfg: NetConfig) -> None:
        self.rng = rng
        self.cfg = cfg
        self.in_flight: list[InFlight] = []
        self.blocked: set[tuple[int, int]] = set()  # directed links (frm, to) that lose everything
        self.seq = 0
        self.overflowed: list[tuple[int, Message]] = []  # (via, msg) lost to the queue bound; reported
        self.sent = self.delivered = self.dropped = self.duplicated = 0

    def send(self, now: int, m: Message, via: int) -> None:
        self.seq += 1
        self.sent += 1
        self.in_flight.append(InFlight(now + self.rng.randint(0, self.cfg.max_delay), self.seq, m, via))
        if len(self.in_flight) > MAX_IN_FLIGHT:
            f = self.in_flight.pop(0)
            self.overflowed.append((f.via, f.msg))
            self.dropped += 1

    def deliverable(self, now: int, paused: set[int]) -> list[int]:
        """Positions of messages that may be delivered now (a paused receiver takes nothing)."""
        return [i for i, f in enumerate(self.in_flight) if f.due <= now and f.msg.to not in paused]

    def take(self, pos: int, now: int, lossy: bool = True) -> tuple[Message, int, str]:
        """Remove the message at `pos`; (message, via, fate), fate 'deliver', 'drop' or 'blocked'."""
        f = self.in_flight.pop(pos)
        m, via = f.msg, f.via
        if (via, m.to) in self.blocked:
            self.dropped += 1
            return m, via, "blocked"
        if lossy and self.cfg.drop_rate and self.rng.random() < self.cfg.drop_rate:
            self.dropped += 1
            return m, via, "drop"
        if lossy and self.cfg.dup_rate and self.rng.random() < self.cfg.dup_rate:
            self.duplicated += 1
            self.in_flight.append(InFlight(now + self.rng.randint(1, self.cfg.max_delay + 1), f.seq, m, via))
        self.delivered += 1
        return m, via, "deliver"

    def drop_to(self, node_id: int) -> list[tuple[int, Message]]:
        """A crashed node loses everything addressed to it; the lost (via, message) are returned."""
        lost = [(f.via, f.msg) for f in self.in_flight if f.msg.to == node_id]
        self.in_flight = [f for f in self.in_flight if f.msg.to != node_id]
        self.dropped += len(lost)
        return lost

    def partition(self, group: set[int], others: set[int], one_way: bool) -> None:
        for a in group:
            for b in others:
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()
