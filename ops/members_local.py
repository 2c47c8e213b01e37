"""`xraftctl local add-node --dir DIR`: one more node for a running `xraftctl local up` cluster.

Picks the next node id (ids of cluster.json's nodes, removed ones included, are never
reused) and two free ports, starts `xraft-node --join SEED` (SEED: a running node's gRPC
address; the node reads the slot map from it and waits), records it in cluster.json (later
`local up/down/status/kill` treat it like the others; it restarts with --join), then runs
`xraftctl node add` for it (members_cli.py): it gets replicas and leaders.
"""
from __future__ import annotations

from pathlib import Path

import click

from . import local_cluster as lc
from .cluster_status import Connection
from .members_cli import add_node as node_add, result_text


def add_node(dir_: str, timeout: float, wait_s: float, progress: lc.Progress, show: bool) -> dict:
    with lc.locked(dir_):
        cluster = lc.load(dir_)
        alive = [n for n in cluster.nodes if lc.is_alive(cluster, n)]
        if not alive:
            raise lc.LocalClusterError(f"no node of {cluster.dir} is running: `xraftctl local up --dir {dir_}` first")
        if cluster.groups == 1:
            progress("note: a --groups 1 cluster has one group on every node; the new node gets a replica of it")
        node_id = max(n.id for n in cluster.nodes) + 1
        grpc_port, resp_port = lc.pick_ports(2)
        node_dir = Path(cluster.dir) / f"node-{node_id}"
        (node_dir / "data").mkdir(parents=True, exist_ok=True)
        node = lc.NodeInfo(id=node_id, grpc=f"{lc.HOST}:{grpc_port}", resp=f"{lc.HOST}:{resp_port}",
                           data_dir=str(node_dir / "data"), log=str(node_dir / "node.log"), join=alive[0].grpc)
        cluster.nodes.append(node)
        started = []
        try:
            lc.start_and_wait(cluster, [node], started, timeout, progress, wait_leader=False)
        except BaseException:
            lc.stop_nodes(cluster, started, 5.0, progress)
            cluster.nodes.remove(node)
            lc.save(cluster)
            raise
        lc.save(cluster)
    progress(f"node {node_id} is up (grpc {node.grpc}, resp {node.resp}); adding it to the cluster")
    return node_add(Connection(seed=alive[0].grpc, timeout=5.0), node_id, node.grpc, node.resp, wait_s, show)


def register(local, dir_option, run, progress) -> None:
    @local.command("add-node")
    @dir_option
    @click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(1, 3600),
                  help="Seconds for the new node to start.")
    @click.option("--wait", "wait_s", default=600.0, show_default=True, type=click.FloatRange(1, 86400),
                  help="Seconds for `node add` (replicas caught up and promoted).")
    @click.option("--json", "as_json", is_flag=True, help="Print node add's JSON result.")
    def local_add_node(dir_, timeout, wait_s, as_json):
        """Start one more node joined to the running local cluster and add it (`node add`)."""
        import json
        r = run(add_node, dir_, timeout, wait_s, progress(), not as_json)
        click.echo(json.dumps(r) if as_json else result_text(r))
