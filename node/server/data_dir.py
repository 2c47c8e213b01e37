"""The node's data dir: its lock, its identity, and whether this start may bootstrap.

    DIR/LOCK                     flock'd while the node runs (a second process would corrupt the WAL)
    DIR/node.json                identity: {"cluster_id", "node_id", "incarnation": 32 hex digits,
                                 "bootstrap_pending": bool}
    DIR/peer-incarnations.json   the incarnation of every peer this node has accepted (incarnation.py)
    DIR/group-<g>/               each hosted Raft group's WAL and snapshots (group-1 alone with --groups 1)
    DIR/slot-map.json            the slot map the cluster was founded with (slot_map_store.py)

Why: a node whose disk was wiped and that simply starts again as one of
--peers votes with no log: it has forgotten the votes it cast and the
entries it acknowledged, so an entry committed by a majority that counted it
can lose that majority (Raft's amnesia). So:

  * a node bootstraps (writes --peers as the first voters) only into an EMPTY
    data dir and only when told to: --initial-cluster-state new. An empty dir
    without it is refused, and the message says what to do. `new` on a dir
    that already holds this node's identity is ignored (as etcd ignores
    --initial-cluster-state once its data dir exists), so a supervisor that
    always passes it is harmless on restarts;
  * bootstrapping draws the node's incarnation (16 random bytes) and writes it
    durably before any Raft state exists; every peer Hello carries it, and
    peers refuse a node id that comes back with another one (a wiped node
    started with `new` again);
  * node.json says bootstrap_pending until the group's bootstrap snapshot is
    durable: a crash between the two re-runs the bootstrap (the driver writes
    it only into empty storage); once it is cleared, a group dir without a WAL
    means the Raft data was lost, and the node refuses to start.

A node that lost its disk must rejoin through a membership change: `xraftctl
node remove` its id, then start it under a NEW id with --join and `xraftctl
node add` it (node ids never return; docs/sharding.md "Membership").
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass

from ..runtime.incarnation import PEER_INCARNATIONS_FILE, PeerIncarnations, new_incarnation, \
    parse_incarnation, read_small_file, write_durably
from .config import NodeConfig

log = logging.getLogger("xraft.node")

IDENTITY_FILE = "node.json"
LOCK_FILE = "LOCK"
MAX_IDENTITY_BYTES = 64 << 10


class StartError(Exception):
    """The node cannot start (the message says why); exit 1."""


def _identity_doc(cfg: NodeConfig, incarnation: bytes, bootstrap_pending: bool) -> bytes:
    return json.dumps({"cluster_id": cfg.cluster_id, "node_id": cfg.id, "incarnation": incarnation.hex(),
                       "bootstrap_pending": bootstrap_pending}).encode()


def _has_raft_data(group_dir: str) -> bool:
    """True if the group dir, or any other group-* dir beside it (a node hosting many
    data groups: --groups), holds a WAL segment (every opened group has one)."""
    parent = os.path.dirname(os.path.abspath(group_dir))
    try:
        dirs = [group_dir] + [os.path.join(parent, d) for d in sorted(os.listdir(parent))
                              if d.startswith("group-")]
    except FileNotFoundError:
        return False
    for d in dirs:
        try:
            if any(name.startswith("wal-") for name in os.listdir(os.path.join(d, "wal"))):
                return True
        except (FileNotFoundError, NotADirectoryError):
            continue
    return False


def _lost_disk_message(cfg: NodeConfig, what: str) -> str:
    return (f"{what}. Starting it as one of the voters in --peers would let it vote with no log and "
            f"lose committed writes, so it does not start. If this is the first start of a NEW cluster, "
            f"start each founding node once with --initial-cluster-state new. If node {cfg.id} lost its "
            f"disk, it must rejoin through a membership change under a new id: `xraftctl node remove --id "
            f"{cfg.id}`, then start it with a new --id and --join SEED and run `xraftctl node add`. Starting it with "
            f"--initial-cluster-state new would not help: its peers remember its old incarnation and "
            f"refuse it")


@dataclass
class DataDir:
    cfg: NodeConfig
    lock_fd: int
    incarnation: bytes        # Invariant: INCARNATION_BYTES long, durable in node.json
    bootstrap: bool           # this start may write --peers as the first voters (driver: only if empty)
    peers: PeerIncarnations

    def mark_bootstrapped(self) -> None:
        """After the group's bootstrap is durable: from now on a missing WAL is lost data."""
        if self.bootstrap:
            write_durably(os.path.join(self.cfg.data_dir, IDENTITY_FILE),
                          _identity_doc(self.cfg, self.incarnation, False))
            self.bootstrap = False

    def close(self) -> None:
        os.close(self.lock_fd)


def open_data_dir(cfg: NodeConfig, group_dir: str) -> DataDir:
    """Create the data dir, take its lock (held until close()), check whose it is and decide
    whether this start bootstraps. Raises StartError."""
    try:
        os.makedirs(cfg.data_dir, exist_ok=True)
        fd = os.open(os.path.join(cfg.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StartError(f"cannot use data dir {cfg.data_dir!r}: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise StartError(f"data dir {cfg.data_dir!r} is in use by another process") from None
        raise StartError(f"cannot lock data dir {cfg.data_dir!r}: {exc}") from None
    try:
        incarnation, bootstrap = _identity(cfg, group_dir)
        peers = PeerIncarnations(os.path.join(cfg.data_dir, PEER_INCARNATIONS_FILE))
    except (OSError, ValueError) as exc:
        os.close(fd)
        raise StartError(f"data dir {cfg.data_dir!r}: {exc}") from None
    except StartError:
        os.close(fd)
        raise
    return DataDir(cfg, fd, incarnation, bootstrap, peers)


def _identity(cfg: NodeConfig, group_dir: str) -> tuple[bytes, bool]:
    path = os.path.join(cfg.data_dir, IDENTITY_FILE)
    raw = read_small_file(path, MAX_IDENTITY_BYTES)
    if raw is None:
        if _has_raft_data(group_dir):
            raise StartError(f"{group_dir} holds Raft data but {path} is missing: whose data is it? "
                             f"Refusing to guess; restore {IDENTITY_FILE} or move the directory away")
        if cfg.join:
            # A new node of a running cluster (node_join.py): it bootstraps nothing, every
            # group's state comes from its leader.
            incarnation = new_incarnation()
            write_durably(path, _identity_doc(cfg, incarnation, False))
            log.warning("node %d: new data dir %s, incarnation %s: joining through %s",
                        cfg.id, cfg.data_dir, incarnation.hex(), cfg.join)
            return incarnation, False
        if cfg.initial_cluster_state != "new":
            raise StartError(_lost_disk_message(
                cfg, f"data dir {cfg.data_dir!r} holds no state of node {cfg.id} (no {IDENTITY_FILE}) and "
                     f"--initial-cluster-state is {cfg.initial_cluster_state!r}: this node's disk was lost, "
                     f"or it was never started"))
        # First start of a founding node: the identity (and the incarnation peers will hold it
        # to) is durable before any Raft state exists.
        incarnation = new_incarnation()
        write_durably(path, _identity_doc(cfg, incarnation, True))
        log.warning("node %d: new data dir %s, incarnation %s: bootstrapping voters %s",
                    cfg.id, cfg.data_dir, incarnation.hex(), sorted(cfg.peers))
        return incarnation, True
    try:
        have = json.loads(raw)
    except ValueError as exc:
        raise StartError(f"unreadable {path}: {exc}") from None
    if not isinstance(have, dict) or (have.get("cluster_id"), have.get("node_id")) != (cfg.cluster_id, cfg.id):
        who = {k: have.get(k) for k in ("cluster_id", "node_id")} if isinstance(have, dict) else have
        raise StartError(f"data dir {cfg.data_dir!r} belongs to {who}, "
                         f"not {{'cluster_id': {cfg.cluster_id!r}, 'node_id': {cfg.id}}}")
    pending = have.get("bootstrap_pending", False)
    if not isinstance(pending, bool):
        raise StartError(f"unreadable {path}: bootstrap_pending is not true/false")
    if "incarnation" in have:
        incarnation = parse_incarnation(have["incarnation"], path)
    else:
        # Written by an xraft before incarnations: this disk's state is this node's, so it
        # keeps it under a first incarnation (its peers have never seen one).
        incarnation = new_incarnation()
        write_durably(path, _identity_doc(cfg, incarnation, pending))
        log.warning("node %d: %s had no incarnation; drew %s", cfg.id, path, incarnation.hex())
    if not pending and not cfg.join and not _has_raft_data(group_dir):
        raise StartError(_lost_disk_message(
            cfg, f"{group_dir} holds no Raft log although node {cfg.id} bootstrapped it: its Raft data "
                 f"was lost"))
    if cfg.initial_cluster_state == "new" and not pending:
        log.info("node %d: --initial-cluster-state new ignored: %s already holds this node's state",
                 cfg.id, cfg.data_dir)
    return incarnation, pending
