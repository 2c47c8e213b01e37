"""Clients and an operator: the traffic of a run, and the history the linearizability checker reads.

Clients (one outstanding operation each) put/append/get a few keys through the
node they believe leads. A write is proposed with a unique request id in the
entry; its result is known when the node it was proposed to has applied that
request (it is then in the store's applied-id table). A proposal the core
refuses (ProposalDropped) is known not to have happened and leaves no trace in
the history; one with no result within `request_timeout` steps is recorded as
indeterminate. A get is a ReadIndex read: issued with a unique context, served
from the node's store once it has applied up to the returned index; a get that
times out is simply left out (it observed nothing).

The operator changes membership (add a learner, promote it, remove a voter,
joint changes with ConfChangeV2, leaving an explicit joint config) and
transfers leadership, always through the current leader.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xraft.node.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType as CT,
    ConfChangeV2,
    ProposalDropped,
    ReadState,
)
from xraft.ops.linearizability import INFINITY, Op

from .kv import encode_command

if TYPE_CHECKING:
    from .node import SimNode
    from .simulator import Simulation

KEYS = ("x", "y", "z")
MAX_HISTORY = 5000  # bound on recorded operations per run


@dataclass
class Pending:
    op: Op
    node: int  # the node the request went to
    deadline: int  # step after which the outcome is unknown
    rid: int = 0  # writes: request id in the entry
    ctx: bytes = b""  # reads: ReadIndex context
    read_index: int = -1  # reads: index from the ReadState, once it arrived


class Workload:
    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim
        self.time = 0  # event clock for the history: one tick per call and per return
        self.history: list[Op] = []
        self.pending: dict[int, Pending] = {}  # client -> its outstanding operation
        self.leader_guess: dict[int, int] = {}  # client -> node it sends to
        self.next_rid = 0
        self.committed_rids: list[int] = []  # writes whose success a client saw
        self.counts = {"ok": 0, "dropped": 0, "timeout": 0, "read_ok": 0, "read_timeout": 0}

    def clock(self) -> int:
        self.time += 1
        return self.time

    # ------------------------------------------------ clients

    def idle_clients(self) -> list[int]:
        return [c for c in range(self.sim.cfg.clients) if c not in self.pending]

    def client_action(self, client: int) -> None:
        sim, rng = self.sim, self.sim.rng
        target = sim.nodes.get(self.leader_guess.get(client, 0))
        if target is None or not target.is_up():
            up = sim.up_nodes()
            if not up:
                return
            target = rng.choice(up)
        kind = rng.choice(("get", "get", "put", "append", "append"))
        key = rng.choice(KEYS)
        deadline = sim.now + sim.cfg.request_timeout
        if kind == "get":
            self.issue_read(client, target, key, deadline)
            return
        self.next_rid += 1
        rid = self.next_rid
        value = f"{client}.{rid};"
        op = Op(client=client, kind=kind, key=key, value=value, call=self.clock())
        try:
            target.call(target.rn.propose, encode_command(kind, rid, key, value))
        except ProposalDropped as e:
            self.counts["dropped"] += 1
            sim.trace_event("propose-dropped", target.id, rid, e.reason)
            self.forget_guess(client, target)
            return
        sim.trace_event("propose", target.id, rid, kind, key, value)
        self.pending[client] = Pending(op, target.id, deadline, rid=rid)

    def issue_read(self, client: int, target: "SimNode", key: str, deadline: int) -> None:
        sim = self.sim
        op = Op(client=client, kind="get", key=key, call=self.clock())
        if "stale_reads" in sim.cfg.inject:
            # INJECTED BUG (checker self-test): answer from local state, no ReadIndex round.
            op.output = target.kv.data.get(key)
            op.ret = self.clock()
            self.history.append(op)
            return
        ctx = f"r{client}.{op.call}".encode()
        try:
            target.call(target.rn.read_index, ctx)
        except ProposalDropped:
            self.forget_guess(client, target)
            return
        sim.trace_event("read-index", target.id, ctx)
        self.pending[client] = Pending(op, target.id, deadline, ctx=ctx)

    def forget_guess(self, client: int, node: "SimNode") -> None:
        lead = node.leader_hint() if node.rn is not None else 0
        self.leader_guess[client] = lead if lead else self.sim.rng.choice(sorted(self.sim.nodes))

    def on_read_state(self, node: "SimNode", rs: ReadState) -> None:
        for p in self.pending.values():
            if p.ctx == rs.request_ctx and p.node == node.id:
                p.read_index = rs.index

    def on_applied(self, node: "SimNode") -> None:
        """After a Ready was applied on `node`: complete what it now knows."""
        done = []
        for client, p in self.pending.items():
            if p.node != node.id:
                continue
            if p.rid and p.rid in node.kv.applied_ids:
                p.op.ret = self.clock()
                self.committed_rids.append(p.rid)
                self.counts["ok"] += 1
                done.append(client)
            elif p.ctx and 0 <= p.read_index <= node.kv.applied_index:
                p.op.output = node.kv.data.get(p.op.key)
                p.op.ret = self.clock()
                self.counts["read_ok"] += 1
                done.append(client)
        for client in done:
            p = self.pending.pop(client)
            self.record(p.op)
            self.sim.trace_event("op-done", node.id, p.op.kind, p.op.key, p.op.value, p.op.output)
            self.leader_guess[client] = node.leader_hint() or node.id

    def expire(self, now: int) -> None:
        for client in [c for c, p in self.pending.items() if p.deadline <= now]:
            p = self.pending.pop(client)
            if p.rid:
                p.op.indeterminate = True
                p.op.ret = INFINITY
                self.record(p.op)
                self.counts["timeout"] += 1
            else:
                self.counts["read_timeout"] += 1
            self.sim.trace_event("op-timeout", p.node, p.op.kind, p.op.key, p.op.value)
            node = self.sim.nodes.get(p.node)
            if node is not None and node.rn is not None:
                self.forget_guess(client, node)
            else:
                self.leader_guess.pop(client, None)

    def finish(self) -> None:
        """End of the run: whatever is still outstanding is indeterminate (writes) or void (reads)."""
        for p in self.pending.values():
            if p.rid:
                p.op.indeterminate = True
                p.op.ret = INFINITY
                self.record(p.op)
        self.pending.clear()

    def record(self, op: Op) -> None:
        assert len(self.history) < MAX_HISTORY, "history over its bound"
        self.history.append(op)

    # ------------------------------------------------ operator

    def admin_action(self) -> None:
        sim, rng = self.sim, self.sim.rng
        lead = sim.current_leader()
        if lead is None:
            return
        cs = lead.conf_state
        voters = list(cs.voters)
        choice = rng.random()
        try:
            if cs.is_joint():
                if not cs.auto_leave:
                    self.propose_cc(lead, ConfChangeV2(), "leave-joint")
            elif choice < 0.2 and len(voters) > 1:
                to = rng.choice([v for v in voters if v != lead.id])
                sim.trace_event("transfer-leader", lead.id, to)
                lead.call(lead.rn.transfer_leader, to)
            elif choice < 0.45 and len(sim.nodes) < sim.cfg.max_nodes:
                nid = sim.add_node()
                cc = (ConfChange(CT.ADD_LEARNER_NODE, nid) if rng.random() < 0.5 else
                      ConfChangeV2(changes=(ConfChangeSingle(CT.ADD_LEARNER_NODE, nid),)))
                self.propose_cc(lead, cc, f"add-learner {nid}")
            elif choice < 0.65 and cs.learners:
                nid = rng.choice(cs.learners)
                self.propose_cc(lead, ConfChange(CT.ADD_NODE, nid), f"promote {nid}")
            elif choice < 0.8 and len(voters) > 3:
                nid = rng.choice(voters)
                self.propose_cc(lead, ConfChange(CT.REMOVE_NODE, nid), f"remove {nid}")
            elif cs.learners and len(voters) >= 3:
                # joint: promote a learner and demote or remove a voter in one step (thesis §4.3)
                up = rng.choice(cs.learners)
                down = rng.choice(voters)
                ctype = CT.ADD_LEARNER_NODE if rng.random() < 0.5 else CT.REMOVE_NODE
                trans = rng.choice(list(ConfChangeTransition))
                cc = ConfChangeV2(transition=trans, changes=(ConfChangeSingle(CT.ADD_NODE, up),
                                                             ConfChangeSingle(ctype, down)))
                self.propose_cc(lead, cc, f"joint {trans.name} +{up} {ctype.name} {down}")
        except ProposalDropped as e:
            sim.trace_event("admin-dropped", lead.id, e.reason)

    def propose_cc(self, lead: "SimNode", cc, what: str) -> None:
        self.sim.trace_event("conf-change", lead.id, what)
        lead.call(lead.rn.propose_conf_change, cc)
