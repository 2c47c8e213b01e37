"""A small in-test network of RawNodes: deliver, persist to MemoryStorage, apply, advance.

Every node follows the Ready contract literally (persist + sync, then send
persisted_messages, apply, advance). Messages sit in one FIFO queue until
delivered; filters drop them (isolation, cut links, dropped types).
"""
from __future__ import annotations

import random
from typing import Callable, Iterable, Optional

from xraft.node.raft.codec import decode_conf_change_entry
from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType as MT,
    ReadState,
    Snapshot,
    SnapshotMetadata,
    StateRole,
)


class Net:
    def __init__(self, ids: Iterable[int], seed: int = 1, learners: Iterable[int] = (),
                 storages: Optional[dict] = None, **cfg_overrides) -> None:
        self.ids = sorted(ids)
        self.learner_ids = sorted(learners)
        self.seed = seed
        self.cfg_overrides = cfg_overrides
        self.nodes: dict[int, RawNode] = {}
        self.storage: dict[int, MemoryStorage] = {}
        self.applied: dict[int, list[Entry]] = {}  # committed entries applied, per node
        self.read_states: dict[int, list[ReadState]] = {}
        self.queue: list[Message] = []
        self.filters: list[Callable[[Message], bool]] = []  # True = drop
        self.dropped: list[Message] = []
        self.down: set[int] = set()
        self.conf_states: dict[int, ConfState] = {}
        for nid in self.ids + self.learner_ids:
            st = (storages or {}).get(nid) or self.bootstrap_storage()
            self.add_node(nid, st)

    def bootstrap_storage(self) -> MemoryStorage:
        st = MemoryStorage()
        cs = ConfState(voters=tuple(self.ids), learners=tuple(self.learner_ids))
        st.apply_snapshot(Snapshot(SnapshotMetadata(index=1, term=1, conf_state=cs), b""))
        st.set_hard_state(HardState(term=1, vote=0, commit=1))  # as etcd's Bootstrap: term 1
        st.sync()
        return st

    def config(self, nid: int, **extra) -> Config:
        kw = dict(self.cfg_overrides)
        kw.update(extra)
        return Config(id=nid, rng=random.Random(self.seed * 1000 + nid), **kw)

    def add_node(self, nid: int, st: MemoryStorage, **extra) -> RawNode:
        node = RawNode(self.config(nid, **extra), st)
        self.nodes[nid] = node
        self.storage[nid] = st
        self.applied.setdefault(nid, [])
        self.read_states.setdefault(nid, [])
        self.down.discard(nid)
        return node

    # ------------------------------------------------ driving

    def process_ready(self, nid: int) -> bool:
        node = self.nodes[nid]
        if nid in self.down or not node.has_ready():
            return False
        rd = node.ready()
        st = self.storage[nid]
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
        if rd.entries:
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        st.sync()
        self.queue.extend(rd.messages)
        self.queue.extend(rd.persisted_messages)
        if rd.snapshot is not None:
            self.applied[nid].append(Entry(rd.snapshot.metadata.term, rd.snapshot.metadata.index,
                                           EntryType.NORMAL, b"<snapshot>"))
        for e in rd.committed_entries:
            if e.type != EntryType.NORMAL:
                cc = decode_conf_change_entry(e)
                self.conf_states[nid] = node.apply_conf_change(cc)
            self.applied[nid].append(e)
        self.read_states[nid].extend(rd.read_states)
        node.advance(rd)
        return True

    def deliver_one(self) -> bool:
        if not self.queue:
            return False
        m = self.queue.pop(0)
        if m.to in self.down or m.frm in self.down or any(f(m) for f in self.filters):
            self.dropped.append(m)
            return True
        if m.to in self.nodes:
            self.nodes[m.to].step(m)
        return True

    def stabilize(self, max_rounds: int = 10_000) -> None:
        for _ in range(max_rounds):
            progressed = False
            for nid in list(self.nodes):
                progressed |= self.process_ready(nid)
            while self.deliver_one():
                progressed = True
            if not progressed:
                return
        raise AssertionError("network did not stabilize")

    def tick(self, nids: Optional[Iterable[int]] = None, n: int = 1) -> None:
        for _ in range(n):
            for nid in (nids if nids is not None else list(self.nodes)):
                if nid not in self.down:
                    self.nodes[nid].tick()

    def tick_and_stabilize(self, n: int, nids: Optional[Iterable[int]] = None) -> None:
        for _ in range(n):
            self.tick(nids)
            self.stabilize()

    # ------------------------------------------------ conveniences

    def elect(self, nid: int) -> None:
        self.nodes[nid].campaign()
        self.stabilize()
        assert self.role(nid) == StateRole.LEADER, f"{nid} failed to become leader"

    def role(self, nid: int) -> StateRole:
        return self.nodes[nid].raft.state

    def term(self, nid: int) -> int:
        return self.nodes[nid].raft.term

    def leader_of(self, nid: int) -> int:
        return self.nodes[nid].raft.lead

    def leaders(self) -> list[int]:
        return [n for n in self.nodes if n not in self.down and self.role(n) == StateRole.LEADER]

    def committed(self, nid: int) -> int:
        return self.nodes[nid].raft.raft_log.committed

    def log(self, nid: int) -> list[Entry]:
        return self.nodes[nid].raft.raft_log.all_entries()

    def applied_data(self, nid: int) -> list[bytes]:
        return [e.data for e in self.applied[nid] if e.type == EntryType.NORMAL and e.data]

    def propose(self, nid: int, data: bytes) -> None:
        self.nodes[nid].propose(data)
        self.stabilize()

    # ------------------------------------------------ faults

    def isolate(self, nid: int) -> Callable[[Message], bool]:
        f = lambda m: (m.to == nid) != (m.frm == nid)  # noqa: E731
        self.filters.append(f)
        return f

    def cut(self, a: int, b: int) -> Callable[[Message], bool]:
        f = lambda m: {m.to, m.frm} == {a, b}  # noqa: E731
        self.filters.append(f)
        return f

    def drop_type(self, t: MT, to: Optional[int] = None) -> Callable[[Message], bool]:
        f = lambda m: m.type == t and (to is None or m.to == to)  # noqa: E731
        self.filters.append(f)
        return f

    def heal(self) -> None:
        self.filters.clear()

    def crash(self, nid: int, tear_last: bool = False) -> None:
        """Power loss: keep only what was synced (always everything here) and go down."""
        self.storage[nid] = self.storage[nid].crash(tear_last)
        self.down.add(nid)

    def restart(self, nid: int) -> RawNode:
        self.applied[nid] = []
        return self.add_node(nid, self.storage[nid])

    def compact(self, nid: int, data: bytes = b"image") -> Snapshot:
        """Snapshot node `nid` at its applied index (with its current config) and compact."""
        node = self.nodes[nid]
        idx = node.raft.raft_log.applied
        st = self.storage[nid]
        snap = st.create_snapshot(idx, node.raft.trk.conf_state(), data)
        st.compact(idx)
        st.sync()
        return snap
