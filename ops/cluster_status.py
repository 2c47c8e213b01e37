"""`xraftctl status`: a running cluster's layout, asked through one seed with the SDK.

What it shows is the ClusterLayout answer of the first node that answers (the
seed, then the nodes it names): the epoch, every node (id, gRPC and RESP
addresses, state) and every Raft group (leader, voters, learners, slot
ranges). As JSON (`Layout.to_json`, client/routing.py):

    {"epoch": N,
     "nodes": [{"id": 1, "grpc": "h:p", "resp": "h:p", "state": "up"}, ...],
     "groups": [{"id": 1, "leader": 2, "voters": [1, 2, 3], "learners": [], "slots": "0-5460,..."}, ...]}

"leader" is null when the answering node knows none. A node from before
sharding does not serve ClusterLayout: that is a StatusError saying so.
This module talks to nodes only through the SDK (ops/ never imports node/).
"""
from dataclasses import dataclass
from pathlib import Path

from xraft.client import errors, sync
from xraft.client.routing import Layout

MAX_TOKEN_BYTES = 4096          # as the node's --token-file
MAX_PEM_BYTES = 1 << 20


class StatusError(Exception):
    """The status could not be read; the message says why and what to do."""


@dataclass(frozen=True)
class Connection:
    """How to reach the cluster: a seed's gRPC address, the bearer token and TLS material."""
    seed: str
    token: str | None = None
    tls_ca: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    tls: bool | None = None
    server_name: str | None = None
    timeout: float = 5.0

    def client(self) -> sync.Client:
        return sync.Client([self.seed], token=self.token, timeout=self.timeout, tls=self.tls,
                           root_certificates=self.tls_ca, client_cert=self.tls_cert, client_key=self.tls_key,
                           server_name_override=self.server_name)


def read_file(path: str, what: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise StatusError(f"cannot read the {what} {path}: {e.strerror}") from None
    if len(data) > limit:
        raise StatusError(f"the {what} {path} is over {limit} bytes")
    return data


def read_token(path: str) -> str:
    raw = read_file(path, "token file", MAX_TOKEN_BYTES)
    try:
        token = raw.strip().decode("utf-8")
    except UnicodeDecodeError:
        raise StatusError(f"the token file {path} is not UTF-8") from None
    if not token:
        raise StatusError(f"the token file {path} is empty")
    return token


def fetch_layout(conn: Connection) -> Layout:
    """The cluster's layout, or StatusError."""
    try:
        client = conn.client()
    except (ValueError, TypeError) as e:
        raise StatusError(f"bad connection options: {e}") from None
    try:
        return client.cluster_layout()
    except errors.NotSupportedError:
        raise StatusError(f"the node at {conn.seed} does not serve ClusterLayout: it runs an xraft without "
                          f"sharding (one Raft group owns every slot), so it has no cluster layout to show; "
                          f"`xraftctl local status` or INFO raft on its RESP port describe it") from None
    except errors.XRaftError as e:
        raise StatusError(f"no cluster layout from {conn.seed}: {e.message}") from None
    finally:
        client.close()


def table(layout: Layout) -> str:
    """The layout as the text tables `xraftctl status` prints."""
    state_of = {n.id: n.state for n in layout.nodes}
    lines = [f"epoch {layout.epoch} (answered by node {layout.node_id or '?'})", "",
             f"{'NODE':>4}  {'STATE':8}  {'GRPC':21}  {'RESP':21}  LEADS"]
    for n in layout.nodes:
        leads = [str(g.id) for g in layout.groups if g.leader == n.id]
        lines.append(f"{n.id:>4}  {n.state:8}  {n.grpc:21}  {n.resp or '-':21}  {','.join(leads) or '-'}")
    lines += ["", f"{'GROUP':>5}  {'LEADER':>6}  {'VOTERS':14}  {'LEARNERS':10}  {'#SLOTS':>6}  SLOTS"]
    for g in layout.groups:
        leader = str(g.leader) if g.leader else "none"
        if g.leader and state_of.get(g.leader) not in (None, "up"):
            leader += f"({state_of[g.leader]})"
        count = sum(last - first + 1 for first, last in g.slots)
        lines.append(f"{g.id:>5}  {leader:>6}  {','.join(map(str, g.voters)) or '-':14}  "
                     f"{','.join(map(str, g.learners)) or '-':10}  {count:>6}  {g.slots_text}")
    return "\n".join(lines)


def pem(path: str | None, what: str) -> bytes | None:
    return None if path is None else read_file(str(Path(path)), what, MAX_PEM_BYTES)
