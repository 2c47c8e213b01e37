"""The nemesis' `member` kind: membership changes while the other faults go on.

Each injection starts ONE change in a background thread, through the CLI's own code
(ops/members_cli.py: `xraftctl node add` / `node remove`), and returns at once, so the
next faults (kills, partitions, power cuts...) land while the change runs:
- add: a spare namespace (netns_hosts.up(spares=...)) starts `xraft-node --join SEED`, is
  recorded in cluster.json (restarts after a kill go through --join, as members_local.py
  does) and `node add` gives it replicas and leaders;
- remove: a member (never below MIN_MEMBERS), half the time kill -9 first (a dead node is
  removed the same way); once removed its process is stopped for good.
A change that fails under the faults (the CLI gives up waiting) is run again after the
final heal (`finish`): the CLI resumes from the map. Every start, end and failure goes
into the nemesis timeline (heal's detail, and `finish`'s events).
"""
from __future__ import annotations

import random
import threading
from typing import Optional

from . import faults as fl
from . import local_cluster as lc
from . import members_cli
from . import netns_hosts as nh
from .cluster_status import Connection

MIN_MEMBERS = 3         # a removal never leaves fewer (each group keeps a majority of 3)
CHANGE_WAIT_S = 60.0    # the CLI's --wait for one change under faults
FINAL_WAIT_S = 240.0    # the same change run again after the final heal
START_TIMEOUT_S = 60.0
SPARES = 2              # spare namespaces a run with `member` makes


class Members:
    def __init__(self, dir_: str, faults: fl.Faults, rng: random.Random):
        self.dir, self.faults, self.rng = dir_, faults, rng
        self._thread: Optional[threading.Thread] = None
        self.pending: Optional[tuple] = None     # (op, node id) of a change not known done
        self.log: list = []

    def _spares(self) -> list:
        return [h["id"] for h in self.faults.hosts["nodes"] if h.get("spare")]

    def _mark(self, node_id: int, spare: bool = False, removed: bool = False) -> None:
        """hosts.json's flags for node_id (Faults.ids leaves spares and removed nodes out)."""
        for h in self.faults.hosts["nodes"]:
            if h["id"] == node_id:
                h.pop("spare", None)
                h.update({"spare": True} if spare else {}, **({"removed": True} if removed else {}))
        nh.save_hosts(self.dir, self.faults.hosts)

    def _seed(self) -> str:
        cluster = lc.load(self.dir)
        alive = [n for n in cluster.nodes if n.id in self.faults.ids and lc.is_alive(cluster, n)]
        return (alive or [n for n in cluster.nodes if n.id in self.faults.ids])[0].grpc

    def inject(self) -> str:
        """Start one change (add when a spare is left and a coin says so, else remove)."""
        if self._thread is not None and self._thread.is_alive():
            return f"member change {self.pending} still running"
        if self.pending:     # the last change failed under the faults: the operator runs it again
            self._start(*self.pending)
            return f"node {self.pending[0]} {self.pending[1]} again (resumes from the map)"
        can_add, can_remove = bool(self._spares()), len(self.faults.ids) > MIN_MEMBERS
        if not can_add and not can_remove:
            return "no membership change possible (no spare, at the minimum size)"
        if can_add and (not can_remove or self.rng.random() < 0.5):
            what, op = self._start_spare(), "add"
        else:
            what, op = self._begin_remove(), "remove"
        self._start(op, self.pending[1])
        return what

    def _start(self, op: str, node_id: int) -> None:
        self._thread = threading.Thread(target=self._change, args=(op, node_id, CHANGE_WAIT_S),
                                        name="nemesis-member", daemon=True)
        self._thread.start()

    def _start_spare(self) -> str:
        node_id = self._spares()[0]
        seed = self._seed()
        with lc.locked(self.dir):
            cluster = lc.load(self.dir)
            node = nh.spare_node(self.dir, node_id, join=seed)
            cluster.nodes.append(node)
            lc.start_and_wait(cluster, [node], [], START_TIMEOUT_S, lambda _m: None, False, start=nh.start_node)
            lc.save(cluster)
        self._mark(node_id)
        self.pending = ("add", node_id)
        return f"node {node_id} started with --join {seed}; node add {node_id}"

    def _begin_remove(self) -> str:
        victim = self.rng.choice(self.faults.ids)
        dead = self.rng.random() < 0.5
        killed = self.faults.kill(victim) + "; " if dead else ""
        # Out of the fault pool now: restart_dead must not bring a removed node back.
        self._mark(victim, removed=True)
        self.pending = ("remove", victim)
        return f"{killed}node remove {victim}"

    def _change(self, op: str, node_id: int, wait_s: float) -> str:
        conn = Connection(seed=self._seed(), timeout=5.0)
        try:
            if op == "add":
                node = lc.load(self.dir).node(node_id)
                r = members_cli.add_node(conn, node_id, node.grpc, node.resp, wait_s, False)
            else:
                r = members_cli.remove_node(conn, node_id, wait_s, False)
                self.faults.kill(node_id)    # decommissioned: it never runs again
        except Exception as e:               # the CLI gave up under the faults: run again at the end
            text = f"node {op} {node_id} failed: {e}"
            self.log.append(text)
            return text
        self.pending = None
        text = members_cli.result_text(r)
        self.log.append(text)
        return text

    def heal(self) -> str:
        """Nothing to undo (a membership change is permanent): what finished so far."""
        done, self.log = self.log, []
        return "; ".join(done) or f"member change {self.pending} running"

    def finish(self, timeout: float = FINAL_WAIT_S) -> list:
        """After the final heal: wait for the running change, then run a failed one again."""
        out = []
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return [f"member change {self.pending} still running after {timeout:g}s"]
        out += self.log
        if self.pending:
            out.append("again: " + self._change(*self.pending, timeout))
        self.log = []
        return out
