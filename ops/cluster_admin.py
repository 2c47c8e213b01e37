"""`xraftctl leader transfer` and `xraftctl rebalance --dry-run`, through the SDK.

leader transfer: the SDK's transfer_leader (client/admin.py) waits until the node
leads the group; the result is {"group": G, "leader": N, "term": T}. The nodes keep
the target as the group's preferred leader for their leader balancers (in memory,
until they restart, or until a transfer back to the slot map's preferred leader),
so the balancer does not move the group back.

rebalance --dry-run: the plan a node computes on its slot map (plan_rebalance), as

    {"epoch": E, "node_id": N,
     "slot_moves": [{"first": a, "last": b, "slots": n, "from_group": g, "to_group": h}, ...],
     "leader_changes": [{"group": g, "from_node": n, "to_node": m}, ...]}

Nothing is applied here; `xraftctl rebalance` without --dry-run applies the plan
(rebalance_cli.py).
This module talks to nodes only through the SDK (ops/ never imports node/).
"""
from xraft.client import errors

from .cluster_status import Connection, StatusError



def _ask(conn: Connection, what: str, fn):
    try:
        client = conn.client()
    except (ValueError, TypeError) as e:
        raise StatusError(f"bad connection options: {e}") from None
    try:
        return fn(client)
    except errors.NotSupportedError:
        raise StatusError(f"the node at {conn.seed} does not serve {what}: it runs an xraft without it") from None
    except errors.XRaftError as e:
        again = " (retriable: try again)" if e.retriable else ""
        raise StatusError(f"{what} failed: {e.message}{again}") from None
    finally:
        client.close()


def transfer_leader(conn: Connection, group_id: int, to_node: int) -> dict:
    r = _ask(conn, "leader transfer", lambda c: c.transfer_leader(group_id, to_node, timeout=conn.timeout))
    if r.leader != to_node:      # the server answers only once the target leads; say so if not
        raise StatusError(f"group {group_id} is led by node {r.leader or 'none'}, not node {to_node}")
    return {"group": r.group_id, "leader": r.leader, "term": r.term}


def transfer_text(result: dict) -> str:
    return f"group {result['group']} is now led by node {result['leader']} (term {result['term']})"


def rebalance_plan(conn: Connection) -> dict:
    r = _ask(conn, "rebalance plan", lambda c: c.rebalance_plan(timeout=conn.timeout))
    return {"epoch": r.epoch, "node_id": r.node_id,
            "slot_moves": [{"first": m.first, "last": m.last, "slots": m.last - m.first + 1,
                            "from_group": m.from_group, "to_group": m.to_group} for m in r.slot_moves],
            "leader_changes": [{"group": c.group_id, "from_node": c.from_node, "to_node": c.to_node}
                               for c in r.leader_changes]}


def plan_text(plan: dict) -> str:
    moves, leaders = plan["slot_moves"], plan["leader_changes"]
    head = f"rebalance plan for the slot map of epoch {plan['epoch']} (computed by node {plan['node_id']})"
    if not moves and not leaders:
        return f"{head}: nothing to change, the cluster is balanced"
    lines = [f"{head}: {len(moves)} slot move(s) ({sum(m['slots'] for m in moves)} slots), "
             f"{len(leaders)} preferred leader change(s)"]
    if moves:
        lines.append("slot moves:")
        lines += [f"  slots {m['first']}-{m['last']} ({m['slots']}): group {m['from_group']} -> group {m['to_group']}"
                  for m in moves]
    if leaders:
        lines.append("preferred leaders:")
        lines += [f"  group {c['group']}: node {c['from_node']} -> node {c['to_node']}" for c in leaders]
    lines.append("dry run: nothing was applied (`xraftctl rebalance` without --dry-run applies it)")
    return "\n".join(lines)
