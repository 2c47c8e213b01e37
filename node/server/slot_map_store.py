"""The node's copy of the slot map: DIR/slot-map.json (cluster/slot_map.py's canonical encoding).

A founding start (the data dir's bootstrap, data_dir.py) computes
`placement.initial_layout(--peers, --groups)` and writes it durably (tmp,
fsync, rename, dir fsync: a crash leaves the old file or the new one, whole)
before any group exists; every founding node computes the same map from the
same --peers, --resp-peers and --groups, so they agree without talking. Later
starts read it back, validated by SlotMap.decode:

    file present        its map; --groups must equal its number of groups (refused otherwise:
                        the slots were split when the cluster was founded)
    file absent,        a data dir from before slot maps: one group owns every slot; only
    not bootstrapping   --groups 1 is accepted, and the map is computed, not written
    file absent,        the founding map, written now (a crash before the bootstrap finished
    bootstrapping       re-runs it: the same inputs give the same bytes)
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

from ..cluster.placement import DEFAULT_REPLICAS, initial_layout
from ..cluster.slot_map import MAX_ENCODED_BYTES, NodeSpec, SlotMap, SlotMapError
from ..runtime.incarnation import read_small_file, write_durably
from .config import NodeConfig
from .data_dir import StartError

SLOT_MAP_FILE = "slot-map.json"


def founding_layout(cfg: NodeConfig) -> SlotMap:
    """The epoch-1 map from --peers, --resp-peers and --groups alone (the same on every
    founding node: nothing node-local such as this node's own --resp enters it)."""
    nodes = {nid: NodeSpec(nid, grpc, cfg.resp_peers.get(nid, "")) for nid, grpc in cfg.peers.items()}
    # One group: every peer a voter, as before slot maps existed; more: 3 replicas each.
    return initial_layout(nodes, cfg.groups, len(nodes) if cfg.groups == 1 else DEFAULT_REPLICAS)


def slot_map_path(cfg: NodeConfig) -> str:
    return os.path.join(cfg.data_dir, SLOT_MAP_FILE)


def load_slot_map(cfg: NodeConfig, bootstrap: bool,
                  crash_hook: Callable[[str], None] = lambda step: None, joined: Optional[SlotMap] = None) -> SlotMap:
    """The map this node serves (module doc). Raises StartError. `joined`: the seed's map of
    a node started with --join (node_join.py), its founding record on the first start."""
    path = slot_map_path(cfg)
    try:
        raw = read_small_file(path, MAX_ENCODED_BYTES)
    except (OSError, ValueError) as exc:
        raise StartError(f"cannot read {path}: {exc}") from None
    if raw is None and joined is not None:
        try:
            write_durably(path, joined.encode(), crash_hook)
        except OSError as exc:
            raise StartError(f"cannot write {path}: {exc}") from None
        return joined
    if raw is None:
        if bootstrap:
            layout = founding_layout(cfg)
            try:
                write_durably(path, layout.encode(), crash_hook)
            except OSError as exc:
                raise StartError(f"cannot write {path}: {exc}") from None
            return layout
        if cfg.groups != 1:
            raise StartError(f"--groups {cfg.groups}: data dir {cfg.data_dir!r} was founded before slot maps "
                             f"existed, with one group owning every slot; start it with --groups 1")
        return founding_layout(dataclasses.replace(cfg, groups=1))
    try:
        layout = SlotMap.decode(raw)
    except SlotMapError as exc:
        raise StartError(f"{path} is not a valid slot map ({exc}); refusing to guess which slots "
                         f"this node serves") from None
    if len(layout.groups) != cfg.groups and not cfg.join:
        raise StartError(f"--groups {cfg.groups}, but this cluster was founded with {len(layout.groups)} "
                         f"group(s) ({path}); the slots cannot be re-split by a flag: start it with "
                         f"--groups {len(layout.groups)}")
    if cfg.id not in layout.nodes and not cfg.join:
        raise StartError(f"node {cfg.id} is not in the slot map {path} (nodes {sorted(layout.nodes)})")
    return layout
