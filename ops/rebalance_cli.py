"""`xraftctl rebalance` without --dry-run: apply the plan one change at a time.

Each round asks a node for the plan (RebalancePlan: plan_rebalance on its map) and applies
only its FIRST change, then plans again from the new map (docs/sharding.md: one BeginMove
driven to its end at a time, so only one slot run is frozen at once):

    a slot move          `xraftctl slots move` of that run (slots_cli.watch): begun, watched
                         until it ends; an aborted move stops the rebalance (exit 1)
    a preferred leader   SetPreferredLeader(expect_epoch = the plan's epoch) proposed to the
                         metadata group; the nodes' leader balancers then move the leadership
                         (stale: someone changed the map, plan again)

It stops when the plan is empty (exit 0) or after MAX_ROUNDS rounds. The result:
{"result": "balanced" | "failed", "reason", "epoch", "steps": [{"kind": "slot_move", ...the
move's result} | {"kind": "preferred_leader", "group", "from_node", "to_node", "epoch"}]}.
"""
from __future__ import annotations

import json

from .cluster_admin import _ask
from .cluster_status import Connection, StatusError
from .slots_cli import watch

MAX_ROUNDS = 512
MAX_STALE = 20              # stale proposals in a row before giving up (the map keeps changing)


def apply(conn: Connection, wait_s: float, show_progress: bool) -> dict:
    return _ask(conn, "rebalance", lambda c: _apply(c, conn, wait_s, show_progress))


def _apply(client, conn: Connection, wait_s: float, show_progress: bool) -> dict:
    steps, stale, epoch = [], 0, 0
    for _ in range(MAX_ROUNDS):
        plan = client.rebalance_plan(timeout=conn.timeout)
        epoch = plan.epoch
        if plan.slot_moves:
            mv = plan.slot_moves[0]
            r = watch(client, conn, mv.first, mv.last, mv.to_group, wait_s, show_progress)
            steps.append({"kind": "slot_move", **r})
            if r["result"] != "moved":
                return {"result": "failed", "reason": f"slots {mv.first}-{mv.last}: move {r['result']} "
                                                      f"{r['reason']}".strip(), "epoch": r["epoch"], "steps": steps}
            continue
        if not plan.leader_changes:
            return {"result": "balanced", "reason": "", "epoch": epoch, "steps": steps}
        ch = plan.leader_changes[0]
        change = json.dumps({"v": 1, "kind": "set_preferred_leader", "expect_epoch": plan.epoch,
                             "group_id": ch.group_id, "node_id": ch.to_node}, sort_keys=True, separators=(",", ":"))
        r = client.propose_map_change(change.encode(), timeout=conn.timeout)
        if r.applied:
            stale = 0
            steps.append({"kind": "preferred_leader", "group": ch.group_id, "from_node": ch.from_node,
                          "to_node": ch.to_node, "epoch": r.epoch})
        elif r.refused_kind == "stale_epoch":
            stale += 1              # the answering node's map lagged, or someone else changed it
            if stale > MAX_STALE:
                raise StatusError(f"the slot map kept changing under the plan ({MAX_STALE} stale proposals)")
        else:
            raise StatusError(f"the metadata group refused a planned change: {r.refused}")
    return {"result": "failed", "reason": f"not balanced after {MAX_ROUNDS} changes", "epoch": epoch,
            "steps": steps}


def text(r: dict) -> str:
    lines = []
    for s in r["steps"]:
        if s["kind"] == "preferred_leader":
            lines.append(f"group {s['group']}: preferred leader node {s['from_node']} -> node {s['to_node']} "
                         f"(epoch {s['epoch']})")
        else:
            lines.append(f"slots {s['first']}-{s['last']}: group {s['from_group']} -> group {s['to_group']}: "
                         f"{s['result']} in {s['move_s']:.2f}s")
    if r["result"] == "balanced":
        lines.append(f"balanced at epoch {r['epoch']} ({len(r['steps'])} change(s) applied)")
    else:
        lines.append(f"NOT balanced: {r['reason']}")
    return "\n".join(lines)
