"""The nemesis' `member` kind: membership changes while the other faults go on.

Each injection starts ONE change in a background thread, through the CLI's own code
(ops/members_cli.py: `xraftctl node add` / `node remove`), and returns at once, so the
next faults (kills, partitions, power cuts...) land while the change runs:
- add: a spare namespace (netns_hosts.up(spares=...)) starts `xraft-node --join SEED`, is
  recorded in cluster.json (restarts after a kill go through --join, as members_local.py
  does) and `node add` gives it replicas and leaders;
- remove: a member (never below MIN_MEMBERS), half the time kill -9 first (a dead node is
  removed the same way); once removed its process is stopped for good;
- replace a wiped node: kill -9 a member, wipe its data dir, `node remove` it, then start
  a node with a NEW id in the same namespace, address and disk (hosts.json gets a row for
  it, "replaces": the old id; node-<new>/mnt links to the old node's mount) with --join,
  and `node add` it;
- move: `xraftctl slots move` (ops/slots_cli.py) of a random slot range to another group,
  half the time a range holding the workload's keys (one slot: they share a hash tag).
A change that fails under the faults (the CLI gives up waiting) is run again after the
final heal (`finish`): the CLI resumes from the map. Every start, end and failure goes
into the nemesis timeline (heal's detail, and `finish`'s events).
"""
from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Optional

from xraft.client.slots import key_slot

from . import faults as fl
from . import local_cluster as lc
from . import members_cli
from . import nemesis_workload as wl
from . import netns_hosts as nh
from . import slots_cli
from .cluster_admin import _ask
from .cluster_status import Connection, StatusError

MIN_MEMBERS = 3         # a removal never leaves fewer (each group keeps a majority of 3)
CHANGE_WAIT_S = 60.0    # the CLI's --wait for one change under faults
FINAL_WAIT_S = 240.0    # the same change run again after the final heal
START_TIMEOUT_S = 60.0  # a spare's or replacement's start: the lock (a heal's restart may hold it), then ready
START_TIMEOUT_ENV = "XRAFT_NEMESIS_START_TIMEOUT_S"   # tests: a start that times out on purpose
SPARES = 2              # spare namespaces a run with `member` makes
MAX_MOVE_SLOTS = 512    # a move's range, at most


class Members:
    def __init__(self, dir_: str, faults: fl.Faults, rng: random.Random,
                 progress: lc.Progress = lambda _m: None):
        self.dir, self.faults, self.rng, self.progress = dir_, faults, rng, progress
        self.start_timeout = float(os.environ.get(START_TIMEOUT_ENV, START_TIMEOUT_S))
        self._thread: Optional[threading.Thread] = None
        self.pending: Optional[tuple] = None     # (op, node id or move range) of a change not known done
        self.log: list = []
        self._round: list = []

    def _spares(self) -> list:
        return [h["id"] for h in self.faults.hosts["nodes"] if h.get("spare") and "replaces" not in h]

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
        """Start one change: add (a spare is left), remove or replace (above the minimum
        size), or a slot move."""
        if self._thread is not None and self._thread.is_alive():
            return f"member change {self.pending} still running"
        if self.pending:     # the last change failed under the faults: the operator runs it again
            self._start(*self.pending)
            return f"{self.pending[0]} {self.pending[1]} again (resumes from the map)"
        possible = ["move"] + (["add"] if self._spares() else []) + (
            ["remove", "replace"] if len(self.faults.ids) > MIN_MEMBERS else [])
        # In rounds (each a fresh shuffle), as the nemesis' kinds: a run with few member
        # faults still sees each change.
        self._round = [op for op in self._round if op in possible] or self.rng.sample(possible, len(possible))
        op = self._round.pop()
        if op == "add":
            what = self._begin_add()
        elif op == "remove":
            what = self._begin_remove()
        elif op == "replace":
            what = self._begin_replace()
        else:
            what, self.pending = "slots move (range chosen from the map)", ("move", None)
        if self.pending:
            self._start(*self.pending)
        return what

    def _start(self, op: str, arg) -> None:
        self._thread = threading.Thread(target=self._change, args=(op, arg, CHANGE_WAIT_S),
                                        name="nemesis-member", daemon=True)
        self._thread.start()

    def _begin_add(self) -> str:
        """The spare joins the cluster: recorded now (cluster.json, then hosts.json: a member
        the faults may hit), started and added in the change thread, so the next faults land
        while it boots and a start that times out is a failed change (run again at the end)."""
        node_id = self._spares()[0]
        try:
            self._record(node_id, self._seed())
        except lc.LocalClusterError as e:     # still a spare: a later add takes it
            return f"node add {node_id} not begun: {e}"
        self.pending = ("add", node_id)
        return f"node {node_id} starts with --join; node add {node_id}"

    def _record(self, node_id: int, seed: str) -> None:
        """node_id into cluster.json (a --join node), THEN out of hosts.json's spares: the
        faults' heal (Faults.ids, from hosts.json) must never meet a member that cluster.json
        lacks (a member soak's final heal failed on "no node 8" when the start could not run).
        An error here (the lock not had in time) leaves it a spare: nothing half recorded."""
        replaces = next((h.get("replaces") for h in self.faults.hosts["nodes"] if h["id"] == node_id), None)
        with nh.locked_waiting(self.dir, self.start_timeout):
            cluster = lc.load(self.dir)
            if not any(n.id == node_id for n in cluster.nodes):
                cluster.nodes.append(nh.spare_node(self.dir, node_id, join=seed))
            # The node it replaces is gone for good, and at the same address: left in
            # cluster.json it would be in every later start's --peers beside its replacement,
            # which xraft-node refuses ("two nodes share an address"; a member soak's restart).
            cluster.nodes = [n for n in cluster.nodes if n.id != replaces]
            lc.save(cluster)
        self._mark(node_id)

    def _ensure_running(self, node_id: int) -> None:
        """Start node_id (recorded by _record) unless it runs; a kill's heal may have started it."""
        with nh.locked_waiting(self.dir, self.start_timeout):
            cluster = lc.load(self.dir)
            node = cluster.node(node_id)
            if not lc.is_alive(cluster, node):
                lc.start_and_wait(cluster, [node], [], self.start_timeout, lambda _m: None, False,
                                  start=nh.start_node)
                lc.save(cluster)

    def _begin_remove(self) -> str:
        victim = self.rng.choice(self.faults.ids)
        dead = self.rng.random() < 0.5
        killed = self.faults.kill(victim) + "; " if dead else ""
        # Out of the fault pool now: restart_dead must not bring a removed node back.
        self._mark(victim, removed=True)
        self.pending = ("remove", victim)
        return f"{killed}node remove {victim}"

    def _begin_replace(self) -> str:
        """kill -9 a member and wipe its data: the disk of a machine that is replaced."""
        victim = self.rng.choice(self.faults.ids)
        killed = self.faults.kill(victim)
        self._mark(victim, removed=True)
        data = Path(lc.load(self.dir).node(victim).data_dir)
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True, exist_ok=True)
        self.pending = ("replace", victim)
        return f"{killed}; data of {victim} wiped; node remove {victim}, then a new node in its place"

    def _replacement(self, old: int) -> int:
        """The id of the node that takes old's place (made, started and recorded once: a
        replace run again after a failure finds it)."""
        hosts = self.faults.hosts
        row = next((h for h in hosts["nodes"] if h.get("replaces") == old), None)
        if row is None:
            old_row = next(h for h in hosts["nodes"] if h["id"] == old)
            new_id = max(h["id"] for h in hosts["nodes"]) + 1
            node_dir = Path(self.dir) / f"node-{new_id}"
            node_dir.mkdir(parents=True, exist_ok=True)
            if not (node_dir / "mnt").exists():    # the same disk: the old node's wiped mount
                os.symlink(Path(self.dir) / f"node-{old}" / "mnt", node_dir / "mnt")
            # A spare until cluster.json lists it too (_record).
            row = {"id": new_id, "netns": old_row["netns"], "address": old_row["address"],
                   "veth": old_row["veth"], "replaces": old, "spare": True}
            hosts["nodes"].append(row)
            nh.save_hosts(self.dir, hosts)
        if row.get("spare"):
            self._record(row["id"], self._seed())
        self._ensure_running(row["id"])
        return row["id"]

    def _move(self, conn: Connection, planned, wait_s: float) -> dict:
        """slots move of `planned` (first, last, group) or, when None, of a range chosen now."""
        if planned is None:
            planned = self._plan_move(_ask(conn, "slot map", lambda c: slots_cli.read_map(c, conn)))
            self.pending = ("move", planned)
        first, last, group = planned
        return slots_cli.move(conn, f"{first}-{last}", group, wait_s, False)

    def _plan_move(self, slot_map: dict) -> tuple:
        """A range inside one owner's run (half the time the run of the workload's slot),
        to another group of the map."""
        slot = key_slot(wl.STREAM.encode()) if self.rng.random() < 0.5 else self.rng.randrange(16384)
        a, b, owner = next(r for r in slot_map["slots"] if r[0] <= slot <= r[1])
        first = self.rng.randint(max(a, slot - MAX_MOVE_SLOTS // 2), slot)
        last = self.rng.randint(slot, min(b, first + MAX_MOVE_SLOTS - 1))
        groups = [g["id"] for g in slot_map["groups"]]
        return first, last, self.rng.choice([g for g in groups if g != owner] or groups)

    def _change(self, op: str, arg, wait_s: float) -> str:
        t0 = time.monotonic()
        self.progress(f"member: {op} {arg} begins")
        text = self._change_once(op, arg, wait_s)
        self.progress(f"member: {text} ({time.monotonic() - t0:.1f}s)")
        return text

    def _change_once(self, op: str, arg, wait_s: float) -> str:
        conn = Connection(seed=self._seed(), timeout=5.0)
        try:
            if op == "add":
                self._ensure_running(arg)
                node = lc.load(self.dir).node(arg)
                r = members_cli.add_node(conn, arg, node.grpc, node.resp, wait_s, False)
            elif op == "replace":
                members_cli.remove_node(conn, arg, wait_s, False)
                new_id = self._replacement(arg)
                self.pending = ("add", new_id)
                node = lc.load(self.dir).node(new_id)
                r = members_cli.add_node(conn, new_id, node.grpc, node.resp, wait_s, False)
                r = dict(r, replaced=arg)
            elif op == "move":
                r = self._move(conn, arg, wait_s)
                if r["result"] == "timeout":      # still going: watched again at the end
                    raise nh.HostsError(slots_cli.move_text(r))
            else:
                r = members_cli.remove_node(conn, arg, wait_s, False)
                self.faults.kill(arg)    # decommissioned: it never runs again
        except StatusError as e:
            if op != "move" or "refused the move" not in str(e):
                return self._failed(op, arg, e)
            self.pending = None                  # refused (another move holds those slots): nothing happened
            text = f"slots move {arg}: {e}"
            self.log.append(text)
            return text
        except Exception as e:               # the CLI gave up under the faults: run again at the end
            return self._failed(op, arg, e)
        self.pending = None
        text = slots_cli.move_text(r) if op == "move" else members_cli.result_text(r) + (
            f" (in place of wiped node {arg})" if op == "replace" else "")
        self.log.append(text)
        return text

    def _failed(self, op: str, arg, e: Exception) -> str:
        text = f"{op} {self.pending[1] if self.pending else arg} failed: {e}"
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
