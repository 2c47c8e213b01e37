"""Node liveness for quiesced groups: one message per peer node per tick for all groups.

A quiesced group (node/raft/quiesce.py) sends nothing and ticks nothing, so its followers
cannot see their leader die. This module watches the leaders' NODES instead, at a cost
per node and tick, not per group:

  * Each tick, a node sends every peer node that replicates one of its groups one liveness
    message: a HEARTBEAT of the reserved group LIVENESS_GROUP_ID whose context lists
    (group, term) for every group it leads quiesced (split at the codec's context limit;
    empty if it leads none). It rides the per-peer batch like every other message.
  * A node counts, per peer node, the ticks since it last received any batch from it.
    A quiesced follower whose leader's node has been silent for silence_ticks (the
    election timeout) is woken with its lease expired: it campaigns within one more
    election timeout, so failover takes at most what it takes without quiescence
    (an election timeout of silence, then a randomized one).
  * A quiesced leader whose voters' nodes, itself included, no longer form a quorum of
    nodes heard within silence_ticks is woken with its lease expired: it heartbeats again
    and check-quorum steps it down if they stay silent (what the health check and clients
    rely on: a leader cut off from its quorum stops serving).
  * A liveness message that does not list (group, term) for a quiesced follower of its
    sender wakes that follower (lease kept): the leader restarted, stepped down or woke;
    an awake leader heartbeats it anyway.

Every wake is safe (a woken member is an ordinary Raft member), so the watch may be eager;
what it must never do is miss a dead leader, and silence is checked on every tick.
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable, Iterable

from ..cluster.slot_map import node_of_replica
from ..raft.codec import MAX_CONTEXT_BYTES
from ..raft.quorum import VoteResult
from ..raft.types import Message, MessageType, StateRole

if TYPE_CHECKING:
    from .raft_driver import GroupDriver

LIVENESS_GROUP_ID = (1 << 64) - 1  # never a Raft group (MultiRaft.add_group refuses it)
_PAIR = struct.Struct("<QQ")  # (group id, term)
MAX_PAIRS_PER_MESSAGE = MAX_CONTEXT_BYTES // _PAIR.size
_LEADER = StateRole.LEADER


def encode_leads(pairs: list[tuple[int, int]]) -> list[bytes]:
    """Contexts of the liveness messages listing `pairs`; at least one (maybe empty)."""
    chunks = [pairs[i:i + MAX_PAIRS_PER_MESSAGE] for i in range(0, len(pairs), MAX_PAIRS_PER_MESSAGE)]
    return [b"".join(_PAIR.pack(g, t) for g, t in chunk) for chunk in chunks] or [b""]


def decode_leads(ctx: bytes) -> set[tuple[int, int]]:
    """The (group, term) pairs of a liveness context; ValueError if it is not one."""
    if len(ctx) % _PAIR.size:
        raise ValueError(f"liveness context of {len(ctx)} bytes, not a multiple of {_PAIR.size}")
    return {p for p in _PAIR.iter_unpack(ctx)}


class NodeLiveness:
    def __init__(self, node_id: int, silence_ticks: int):
        if silence_ticks <= 0:
            raise ValueError("silence_ticks must be > 0")
        self.node_id = node_id
        self.silence_ticks = silence_ticks
        self.silent: dict[int, int] = {}  # peer node -> ticks since its last batch (peers we watch)
        self.watching: dict[int, list["GroupDriver"]] = {}  # leader node -> our quiesced followers of it
        self.sent = 0  # liveness messages sent
        self.wakes_silent = 0  # followers woken because their leader's node went silent
        self.wakes_unlisted = 0  # ... because their leader's node no longer listed the group
        self.wakes_lost_quorum = 0  # quiesced leaders woken: their voters' nodes went silent
        self.bad_messages = 0

    def heard(self, peer: int) -> None:
        """Any batch from `peer` proves its node is up."""
        if peer in self.silent:
            self.silent[peer] = 0

    def on_tick(self, groups: Iterable["GroupDriver"], send: Callable[[int, Message], None]) -> None:
        """Once per node tick: count silence, wake what it concerns, send our liveness messages."""
        leads: list[tuple[int, int]] = []
        peers: set[int] = set()
        watching: dict[int, list["GroupDriver"]] = {}
        leaders_asleep: list["GroupDriver"] = []
        quiescing = False  # some group here may quiesce: else nobody needs our liveness
        for g in groups:
            if g.failed is not None:
                continue
            r = g.rn.raft
            quiescing = quiescing or r.cfg.quiesce
            peers.update(node_of_replica(p) for p in r.trk.progress)   # Raft ids are replica ids
            if not r.quiesced:
                continue
            if r.state == _LEADER:
                leads.append((g.group_id, r.term))
                leaders_asleep.append(g)
            else:
                watching.setdefault(node_of_replica(r.lead), []).append(g)
        self.watching = watching
        peers.update(watching)
        peers.discard(self.node_id)
        silent = self.silent
        for peer in peers:
            silent[peer] = silent.get(peer, 0) + 1  # heard() resets it on every batch
        for peer in [p for p in silent if p not in peers]:
            del silent[peer]  # no group of ours involves it any more
        limit = self.silence_ticks
        for lead, followers in watching.items():
            if silent.get(lead, 0) > limit:
                self.wakes_silent += len(followers)
                for g in followers:
                    g.request_wake(lease_expired=True)
        me = self.node_id
        for g in leaders_asleep:
            voters = g.rn.raft.trk.config.voters
            alive = {v: node_of_replica(v) == me or silent.get(node_of_replica(v), 0) <= limit
                     for v in voters.ids()}
            if voters.vote_result(alive) != VoteResult.WON:
                self.wakes_lost_quorum += 1
                g.request_wake(lease_expired=True)
        if peers and quiescing:
            contexts = encode_leads(leads)
            for peer in peers:
                for ctx in contexts:
                    send(LIVENESS_GROUP_ID, Message(MessageType.HEARTBEAT, to=peer, frm=me, context=ctx))
                    self.sent += 1

    def received(self, peer: int, m: Message) -> None:
        """A liveness message from `peer`: wake our quiesced followers of it that it no longer lists."""
        followers = self.watching.get(peer)
        if not followers:
            return
        if m.type != MessageType.HEARTBEAT:
            self.bad_messages += 1
            return
        try:
            listed = decode_leads(m.context)
        except ValueError:
            self.bad_messages += 1
            return
        for g in followers:
            r = g.rn.raft
            if r.quiesced and node_of_replica(r.lead) == peer and (g.group_id, r.term) not in listed:
                self.wakes_unlisted += 1
                g.request_wake(lease_expired=False)
