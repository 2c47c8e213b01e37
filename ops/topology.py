"""One description of a cluster's nodes, and the `xraft-node` command line each gets.

Every way xraftctl starts nodes goes through node_argv(): the local cluster
(local_cluster.py, processes on loopback) and the compose file
(compose.py, one container per node). What a compose file starts is therefore
what the tests start, flag for flag; only addresses and paths differ.

A node listens on `grpc`/`resp` and is reached by peers and clients at
`grpc_advertise`/`resp_advertise` (the same unless it listens on a wildcard,
as in a container: 0.0.0.0:7001 listened, xraft-1:7001 advertised). --peers
carries the advertised gRPC addresses (what peers dial, and what the SDK is
told), --resp-peers the advertised RESP addresses (-MOVED, CLUSTER SLOTS).
"""
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class NodeSpec:
    id: int
    grpc: str                       # gRPC listen address (client API + peers)
    resp: str                       # RESP listen address
    data_dir: str
    grpc_advertise: Optional[str] = None   # default: grpc
    resp_advertise: Optional[str] = None   # default: resp
    metrics: Optional[str] = None          # --metrics listen address; None: no metrics endpoint

    @property
    def peer_grpc(self) -> str:
        return self.grpc_advertise or self.grpc

    @property
    def peer_resp(self) -> str:
        return self.resp_advertise or self.resp


@dataclass(frozen=True)
class Topology:
    cluster_id: str
    nodes: Sequence[NodeSpec]
    secret_file: str                # the shared peer secret, as the node sees the path
    groups: int = 1                 # data Raft groups (--groups); fixed when the cluster is founded
    fsync: Optional[str] = None     # None: the node's default
    token_file: Optional[str] = None   # gRPC client API bearer token (--token-file)
    extra_args: Sequence[str] = ()  # passed to every node verbatim, last (they override)

    def node(self, node_id: int) -> NodeSpec:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)


def node_argv(topology: Topology, node: NodeSpec, founding: bool) -> list:
    """The xraft-node arguments (without the program) that start `node` of `topology`.
    `founding`: pass --initial-cluster-state new (the node may found the cluster in an
    empty data dir; ignored by the node once its data dir holds its state)."""
    argv = [
        "--id", str(node.id),
        "--cluster-id", topology.cluster_id,
        "--data-dir", node.data_dir,
        "--grpc", node.grpc,
        "--resp", node.resp,
        "--peers", ",".join(f"{n.id}={n.peer_grpc}" for n in topology.nodes),
        "--resp-peers", ",".join(f"{n.id}={n.peer_resp}" for n in topology.nodes),
        "--secret-file", topology.secret_file,
    ]
    if topology.token_file:
        argv += ["--token-file", topology.token_file]
    if topology.fsync:
        argv += ["--fsync", topology.fsync]
    if topology.groups != 1:
        argv += ["--groups", str(topology.groups)]
    if node.metrics:
        argv += ["--metrics", node.metrics]
    if founding:
        argv += ["--initial-cluster-state", "new"]
    return argv + list(topology.extra_args)


def join_argv(topology: Topology, node: NodeSpec, seed: str) -> list:
    """The xraft-node arguments of a node that joins the running cluster through `seed`
    (--join: no --peers, --groups or --initial-cluster-state: the seed's map says)."""
    argv = ["--id", str(node.id), "--cluster-id", topology.cluster_id, "--data-dir", node.data_dir,
            "--grpc", node.grpc, "--resp", node.resp, "--join", seed, "--secret-file", topology.secret_file]
    if topology.token_file:
        argv += ["--token-file", topology.token_file]
    if topology.fsync:
        argv += ["--fsync", topology.fsync]
    if node.metrics:
        argv += ["--metrics", node.metrics]
    return argv + list(topology.extra_args)
