"""`xraft-node --join SEED_GRPC`: a new node of a running cluster (docs/sharding.md, "Membership").

Before its data dir is touched, the node reads the slot map from the seed (GetSlotMap, with
the node's own token and TLS) and checks that it may join under its id:

    its id is REMOVED in the map         refused: node ids never return (a wiped or retired
                                         node comes back under a new id, through `node add`)
    its data dir is empty but its id     refused: that node lost its disk (a replica with no
    already replicates groups            log must not count for a quorum): remove it, join
                                         under a new id
    another live node has its --grpc     refused

Then it starts with that map as its founding record (DATA/slot-map.json), hosting nothing:
group 0 and every data group are opened empty (no bootstrap) once the map lists the node, and
the leaders' snapshots fill them. A restart with --join (node.json present) reads the map
again for the REMOVED check; when the seed does not answer it starts from its own disk.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Optional

import grpc

from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from ..cluster.slot_map import NodeState, SlotMap, SlotMapError
from .config import NodeConfig
from .data_dir import IDENTITY_FILE, StartError
from .slot_move_steps import tls_channels

log = logging.getLogger("xraft.node")

FETCH_WAIT_S = 30.0        # a first join waits this long for the seed; a restart, FETCH_RESTART_S
FETCH_RESTART_S = 3.0
RPC_S = 5.0


async def fetch_map(seed: str, tls, token: Optional[str], wait_s: float) -> Optional[SlotMap]:
    """The seed's slot map, or None if it did not answer within wait_s."""
    channel = tls_channels(tls)(seed)
    metadata = (("authorization", "Bearer " + token),) if token else ()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    try:
        while True:
            try:
                r = await pb_grpc.XRaftStub(channel).GetSlotMap(pb.GetSlotMapRequest(), metadata=metadata,
                                                               timeout=min(RPC_S, max(0.1, deadline - loop.time())))
                try:
                    return SlotMap.decode(r.slot_map)
                except SlotMapError as exc:
                    raise StartError(f"--join {seed} answered a slot map that is not valid: {exc}") from None
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise StartError(f"--join {seed} refused us: {exc.details()}") from None
                if loop.time() >= deadline:
                    return None
                await asyncio.sleep(0.5)
    finally:
        await channel.close()


def check_joinable(cfg: NodeConfig, m: SlotMap, fresh: bool) -> None:
    """StartError when this node may not join under its id (module doc)."""
    spec = m.nodes.get(cfg.id)
    if spec is not None and spec.state is NodeState.REMOVED:
        raise StartError(f"node {cfg.id} was removed from this cluster (slot map epoch {m.epoch}) and node ids "
                         f"never return: start it with a new --id and an empty data dir, then "
                         f"`xraftctl node add --id NEW ...`")
    if fresh and spec is not None and m.groups_of_node(cfg.id):
        raise StartError(f"node {cfg.id} already replicates groups {m.groups_of_node(cfg.id)} but its data dir "
                         f"{cfg.data_dir!r} is empty: it lost its disk, and a replica with no log must not "
                         f"vote. Remove it (`xraftctl node remove --id {cfg.id}`) and join under a new id")
    if spec is not None and spec.grpc != cfg.grpc:
        raise StartError(f"node {cfg.id} is in the slot map with --grpc {spec.grpc}, not {cfg.grpc}")
    for other in m.nodes.values():
        if other.node_id != cfg.id and other.state is not NodeState.REMOVED and other.grpc == cfg.grpc:
            raise StartError(f"node {other.node_id} already uses --grpc {cfg.grpc}")


async def prepare_join(cfg: NodeConfig, tls, token: Optional[str]) -> tuple:
    """(cfg with the cluster's number of groups, the seed's map or None)."""
    fresh = not os.path.exists(os.path.join(cfg.data_dir, IDENTITY_FILE))
    m = await fetch_map(cfg.join, tls, token, FETCH_WAIT_S if fresh else FETCH_RESTART_S)
    if m is None:
        if fresh:
            raise StartError(f"--join {cfg.join}: no answer within {FETCH_WAIT_S:.0f}s")
        log.warning("node %d: --join %s did not answer: starting from the data dir", cfg.id, cfg.join)
        return cfg, None
    check_joinable(cfg, m, fresh)
    return dataclasses.replace(cfg, groups=len(m.groups)), m
