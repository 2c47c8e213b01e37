"""`xraftctl node add` / `xraftctl node remove`: membership through the metadata group.

    xraftctl node add --seed S --id N --grpc H:P --resp H:P [--json] [--wait 600]
    xraftctl node remove --seed S --id N [--json] [--wait 600]

Both ask a node for the plan (MembershipPlan: plan_add_node / plan_remove_node on its map,
docs/sharding.md) and apply its changes one at a time, each a compare-and-set on the map's
epoch (ProposeMapChange). Before a PromoteLearner the command waits until the learner is in
the group's Raft configuration and within CATCH_UP_ENTRIES of its leader's log (status from
the group's leader, GroupMembership); the Raft groups follow the map by themselves (the
membership reconciler on the metadata leader). Any refusal (another change got in, a crashed
run left the map half way) plans again from the map, so running the command again after a
crash resumes where the map is. At the end it waits until every group's Raft configuration
equals the map's members.

`node remove` never talks to node N: it works the same when N is dead. `node add` expects N
to be running already (`xraft-node --join S ...`), waiting to be added.

--json prints {"node", "action": "add"|"remove", "epoch", "changes": [{"kind", "group",
"node", "epoch"}], "elapsed_s"}. Progress lines go to stderr.
XRAFTCTL_FAILPOINT=node.after_<kind> (tests) kills the command right after that change applied.
This module talks to nodes only through the SDK (ops/ never imports node/).
"""
from __future__ import annotations

import json
import os
import signal
import time

import click

from xraft.client import errors

from .cluster_admin import _ask
from .cluster_status import Connection, StatusError

CATCH_UP_ENTRIES = 100      # as the node's cluster/membership.py
POLL_S = 0.2
FAILPOINT_ENV = "XRAFTCTL_FAILPOINT"
PLAN_ATTEMPTS = 200         # replans (each after a refusal) before giving up


def _failpoint(name: str) -> None:
    """Tests: XRAFTCTL_FAILPOINT=node.after_<kind> SIGKILLs this process right after a change of
    that kind applied (its first one), as a crash would."""
    if os.environ.get(FAILPOINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _progress(show: bool, text: str) -> None:
    if show:
        click.echo(text, err=True)


def _caught_up(client, conn: Connection, group: int, node: int) -> bool:
    try:
        r = client.group_membership(group, timeout=conn.timeout)
    except errors.XRaftError:
        return False
    for p in r.progress:
        if p.node_id == node:
            return r.last_index > 0 and p.match + CATCH_UP_ENTRIES >= r.last_index
    return False


def _wait(what: str, deadline: float, fn) -> None:
    while not fn():
        if time.monotonic() > deadline:
            raise StatusError(f"gave up waiting: {what} (run the command again to resume)")
        time.sleep(POLL_S)


def _read_map(client, conn: Connection) -> dict:
    return json.loads(client.get_slot_map(timeout=conn.timeout).slot_map)


def _in_sync(client, conn: Connection, m: dict) -> bool:
    """Every data group's Raft configuration is the map's (the reconciler has caught up)."""
    for g in m["groups"]:
        try:
            r = client.group_membership(g["id"], timeout=conn.timeout)
        except errors.XRaftError:
            return False
        if sorted(r.voters) != sorted(g["voters"]) or sorted(r.learners) != sorted(g["learners"]) \
                or r.voters_outgoing:
            return False
    return True


def _transient(e: Exception) -> bool:
    """An error after which asking again (or planning again from the map) is safe."""
    return e.retriable or isinstance(e, (errors.UnknownOutcomeError, errors.UnavailableError,
                                         errors.DeadlineExceededError))


def run_plan(client, conn: Connection, op: str, node: int, grpc: str, resp: str, wait_s: float,
             show: bool) -> dict:
    t0 = time.monotonic()
    deadline = t0 + wait_s
    done = []
    for _ in range(PLAN_ATTEMPTS):
        try:
            plan = client.membership_plan(op, node, grpc, resp, timeout=conn.timeout)
        except errors.XRaftError as e:
            if not _transient(e) or time.monotonic() > deadline:
                raise
            _progress(show, f"planning: {type(e).__name__}; asking again")
            time.sleep(POLL_S)
            continue
        if plan.refused:
            raise StatusError(f"node {op} {node}: {plan.refused}")
        if not plan.changes:
            break
        _progress(show, f"plan at epoch {plan.epoch}: {len(plan.changes)} change(s)")
        for text in plan.changes:
            change = json.loads(text)
            kind, group = change["kind"], change.get("group_id")
            if kind == "promote_learner":
                _progress(show, f"  group {group}: waiting for node {change['node_id']} to catch up")
                _wait(f"node {change['node_id']} catching up in group {group}", deadline,
                      lambda: _caught_up(client, conn, group, change["node_id"]))
            try:
                r = client.propose_map_change(text.encode(), timeout=conn.timeout)
            except errors.XRaftError as e:
                if not _transient(e):
                    raise
                # The change is a compare-and-set on the map's epoch: whether or not it
                # committed, planning again from the map is safe (an applied change is
                # not in the next plan; a lost one is planned again).
                _progress(show, f"  {kind}: {type(e).__name__}; planning again")
                time.sleep(POLL_S)
                if time.monotonic() > deadline:
                    raise StatusError(f"node {op} {node}: not done after {wait_s:.0f}s "
                                      f"(run it again to resume): {e}") from e
                break
            if not r.applied:
                _progress(show, f"  {kind}: {r.refused_kind} ({r.refused}); planning again")
                if r.refused_kind == "invalid" and not r.already_applied and kind != "promote_learner":
                    time.sleep(POLL_S)
                break
            who = change.get("node_id", change.get("node", {}).get("id") if isinstance(change.get("node"), dict)
                              else None)
            done.append({"kind": kind, "group": group, "node": who, "epoch": r.epoch})
            _failpoint("node.after_" + kind)
            _progress(show, f"  epoch {r.epoch}: {kind}" + (f" group {group}" if group else "") +
                      (f" node {who}" if who else ""))
        else:
            continue
        if time.monotonic() > deadline:
            raise StatusError(f"node {op} {node}: not done after {wait_s:.0f}s (run it again to resume)")
    else:
        raise StatusError(f"node {op} {node}: the map kept changing ({PLAN_ATTEMPTS} plans)")
    _progress(show, "waiting for the Raft groups to follow the map")
    m = _read_map(client, conn)
    _wait("the groups' Raft configurations to follow the map", deadline, lambda: _in_sync(client, conn, m))
    return {"node": node, "action": op, "epoch": m["epoch"], "changes": done,
            "elapsed_s": round(time.monotonic() - t0, 3)}


def add_node(conn: Connection, node: int, grpc: str, resp: str, wait_s: float, show: bool) -> dict:
    return _ask(conn, "node add", lambda c: run_plan(c, conn, "add", node, grpc, resp, wait_s, show))


def remove_node(conn: Connection, node: int, wait_s: float, show: bool) -> dict:
    return _ask(conn, "node remove", lambda c: run_plan(c, conn, "remove", node, "", "", wait_s, show))


def result_text(r: dict) -> str:
    verb = "added" if r["action"] == "add" else "removed"
    return f"node {r['node']} {verb}: {len(r['changes'])} change(s), map epoch {r['epoch']}, {r['elapsed_s']:.1f}s"


def register(main, seed_options, run) -> None:
    @main.group()
    def node():
        """Nodes: add one to a running cluster, remove one (dead ones too)."""

    @node.command("add")
    @seed_options
    @click.option("--id", "node_id", required=True, type=click.IntRange(1), help="The new node's id (never used before).")
    @click.option("--grpc", "grpc_address", required=True, metavar="HOST:PORT", help="Its gRPC address.")
    @click.option("--resp", "resp_address", required=True, metavar="HOST:PORT", help="Its RESP address.")
    @click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(1, 86400))
    @click.option("--json", "as_json", is_flag=True, help='Print {"node", "action", "epoch", "changes", "elapsed_s"}.')
    def node_add(conn, node_id, grpc_address, resp_address, wait_s, as_json):
        """Add node N (started with --join S) and give it replicas and leaders.

        AddNode, then for each group it takes: a learner, caught up, promoted, the surplus
        replica removed; then preferred leaders evened onto it. Re-run after a crash: it
        resumes from the map."""
        r = run(add_node, conn, node_id, grpc_address, resp_address, wait_s, not as_json)
        click.echo(json.dumps(r) if as_json else result_text(r))

    @node.command("remove")
    @seed_options
    @click.option("--id", "node_id", required=True, type=click.IntRange(1), help="The node to remove.")
    @click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(1, 86400))
    @click.option("--json", "as_json", is_flag=True, help='Print {"node", "action", "epoch", "changes", "elapsed_s"}.')
    def node_remove(conn, node_id, wait_s, as_json):
        """Remove node N (alive or dead): DRAINING, its leaders moved, its replicas replaced
        on other UP nodes (learner, caught up, promoted, N removed), then REMOVED. Its id
        never returns."""
        r = run(remove_node, conn, node_id, wait_s, not as_json)
        click.echo(json.dumps(r) if as_json else result_text(r))

