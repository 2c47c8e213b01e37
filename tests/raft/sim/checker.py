"""The safety checker: Raft's invariants (Figure 3 of the paper, and more), after every event.

Each check is incremental, so it can run after every step of every seed:

  Election Safety      at most one leader per term (`leaders`).
  Log Matching         every (index, term) ever persisted by any node names one entry,
                       with one term at index-1 (`entries`); by induction, two logs that
                       share an (index, term) share the whole prefix.
  Leader Completeness  when a node becomes leader of term T, its log holds every entry
                       committed in a term < T. The commit term is recorded from the
                       leader whose commit index moved (`commit_term`), so entries that a
                       stale leader legitimately lacks are not demanded of it.
  State Machine Safety no two nodes apply different entries at one index (`applied`);
                       equal store digests at equal applied index (`digests`).
  Durability           a node's commit index never goes back: within a run of the process
                       (hard states) and across crashes (never below what was synced).
  Ready contract       must_sync is set whenever entries, a snapshot, term or vote change.
A violation raises SafetyViolation; the simulator adds the seed, the config and the trace.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from xraft.node.raft.types import Compacted, Entry, Ready, Snapshot, StateRole, Unavailable

if TYPE_CHECKING:
    from .node import SimNode


class SafetyViolation(AssertionError):
    pass


def log_term(node: "SimNode", i: int):
    """Term of entry i in the node's whole log (storage + unstable); None if compacted or absent."""
    try:
        return node.rn.raft.raft_log.term(i)
    except (Compacted, Unavailable):
        return None


class SafetyChecker:
    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}  # term -> the node that led it
        self.entries: dict[tuple[int, int], tuple[int, bytes, int]] = {}  # (i, t) -> (type, data, term at i-1)
        self.applied: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, type, data) applied
        self.digests: dict[int, bytes] = {}  # index -> store digest after applying it
        self.commit_term: dict[int, tuple[int, int]] = {}  # index -> (entry term, term it was committed in)
        self.commit_recorded = 0  # commit_term covers (0, commit_recorded]
        self.role_seen: dict[int, tuple[StateRole, int]] = {}  # node -> (role, term) last observed
        self.checks = 0

    def fail(self, what: str) -> None:
        raise SafetyViolation(what)

    # ------------------------------------------------ node life cycle

    def on_start(self, node: "SimNode") -> None:
        committed = node.rn.raft.raft_log.committed
        if committed < node.commit_floor:
            self.fail(f"durability: node {node.id} restarted with commit {committed} below its synced "
                      f"commit {node.commit_floor}")
        self.role_seen.pop(node.id, None)

    # ------------------------------------------------ Ready

    def on_ready(self, node: "SimNode", rd: Ready) -> None:
        self.checks += 1
        hs = rd.hard_state
        prev = node.storage.hard_state()
        needs_sync = bool(rd.entries) or rd.snapshot is not None or (
            hs is not None and (hs.term != prev.term or hs.vote != prev.vote))
        if needs_sync and not rd.must_sync:
            self.fail(f"ready contract: node {node.id} Ready with entries/snapshot/term/vote change "
                      f"but must_sync=False (hard_state {hs}, prev {prev})")
        if hs is not None:
            if hs.commit < node.last_commit:
                self.fail(f"commit went back on node {node.id}: {node.last_commit} -> {hs.commit}")
            if hs.term < prev.term:
                self.fail(f"term went back on node {node.id}: {prev.term} -> {hs.term}")
            node.last_commit = hs.commit
        ce = rd.committed_entries
        for a, b in zip(ce, ce[1:]):
            if b.index != a.index + 1:
                self.fail(f"node {node.id} committed entries not consecutive: {a.index}, {b.index}")
        if ce and ce[-1].index > node.rn.raft.raft_log.committed:
            self.fail(f"node {node.id} hands out entry {ce[-1].index} beyond its commit index")

    def on_persist(self, node: "SimNode", ents) -> None:
        st = node.storage
        for e in ents:
            if e.index < st.first_index():
                continue  # already covered by the storage's snapshot
            prev_term = st.term(e.index - 1)
            key = (e.index, e.term)
            val = (int(e.type), e.data, prev_term)
            seen = self.entries.setdefault(key, val)
            if seen != val:
                self.fail(f"log matching: node {node.id} persisted entry {key} = {val[:2]} after term "
                          f"{prev_term}, but another node has {seen[:2]} after term {seen[2]}")

    # ------------------------------------------------ applying

    def on_apply(self, node: "SimNode", e: Entry) -> None:
        self.checks += 1
        val = (e.term, int(e.type), e.data)
        seen = self.applied.setdefault(e.index, val)
        if seen != val:
            self.fail(f"state machine safety: node {node.id} applied {val} at index {e.index}, "
                      f"another node applied {seen}")
        ct = self.commit_term.get(e.index)
        if ct is not None and ct[0] != e.term:
            self.fail(f"node {node.id} applied term {e.term} at {e.index}, leader committed term {ct[0]}")
        self.check_digest(node, e.index)

    def on_snapshot_applied(self, node: "SimNode", snap: Snapshot) -> None:
        m = snap.metadata
        seen = self.applied.get(m.index)
        if seen is not None and seen[0] != m.term:
            self.fail(f"node {node.id} installed snapshot ({m.index}, term {m.term}) but term {seen[0]} "
                      f"was applied at {m.index}")
        self.check_digest(node, m.index)

    def check_digest(self, node: "SimNode", index: int) -> None:
        d = node.kv.digest()
        seen = self.digests.setdefault(index, d)
        if seen != d:
            self.fail(f"state hash differs at applied index {index}: node {node.id} has {d.hex()}, "
                      f"another node had {seen.hex()}")

    # ------------------------------------------------ after every input

    def after_input(self, node: "SimNode") -> None:
        r = node.rn.raft
        role, term = r.state, r.term
        seen = self.role_seen.get(node.id)
        if role == StateRole.LEADER and seen != (role, term):
            self.on_new_leader(node, term)
        self.role_seen[node.id] = (role, term)
        if role == StateRole.LEADER and r.raft_log.committed > self.commit_recorded:
            self.record_commits(node, term, r.raft_log.committed)

    def on_new_leader(self, node: "SimNode", term: int) -> None:
        other = self.leaders.setdefault(term, node.id)
        if other != node.id:
            self.fail(f"election safety: nodes {other} and {node.id} both leaders of term {term}")
        log = node.rn.raft.raft_log
        lo = max(log.first_index() - 1, 1)
        for i in range(lo, self.commit_recorded + 1):
            et, ct = self.commit_term[i]
            if ct < term and log_term(node, i) != et:
                self.fail(f"leader completeness: node {node.id}, leader of term {term}, has term "
                          f"{log_term(node, i)} at {i}; entry of term {et} was committed in term {ct}")

    def record_commits(self, node: "SimNode", term: int, upto: int) -> None:
        for i in range(self.commit_recorded + 1, upto + 1):
            t = log_term(node, i)
            if t is None:
                # compacted on the leader already: applied, so it was recorded by an earlier leader
                # unless our bookkeeping started late; use the applied record.
                t = self.applied[i][0] if i in self.applied else 0
            self.commit_term[i] = (t, term)
        self.commit_recorded = upto
