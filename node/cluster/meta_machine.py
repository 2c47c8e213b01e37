"""The metadata group's state machine (Raft group 0): the slot map, changed only by its log.

    state       the current SlotMap (its snapshot: the map's canonical JSON, slot_map.encode)
    an entry    one encoded change (changes.encode_change), applied with apply_change
    a result    MetaApplied(map) when the change took effect, MetaRefused(error) when it did
                not: a StaleEpoch, a SlotMapError / MoveError, or bytes that are not a change.
                A refused entry is a no-op on every replica (the check reads only the entry and
                the replicated map), and the refusal goes back to the proposer.

The initial state is the epoch-1 map every founding node computes (placement.py): group 0 is
bootstrapped with this machine's snapshot of it, so a restarted node reads the map back from
group 0's snapshot and log, never from a side file.

Listeners are told every new map (on apply, and on restore from a leader's snapshot),
synchronously on the apply path: they must be quick and must not raise (the node swaps its
routing table and wakes parked requests). Pure: no clock, no I/O.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Union

from ..invariant import invariant
from .changes import StaleEpoch, apply_change, decode_change
from .slot_map import SlotMap, SlotMapError

log = logging.getLogger("xraft.meta")

META_GROUP_ID = 0       # slot_map.py keeps id 0 out of the data groups
META_VOTERS = 3         # voters of group 0; every other node is a learner


@dataclass(frozen=True)
class MetaApplied:
    slot_map: SlotMap   # the map the change produced


@dataclass(frozen=True)
class MetaRefused:
    error: Exception    # StaleEpoch or SlotMapError (MoveError included); nothing changed
    epoch: int          # the map's epoch when the change was refused


MetaResult = Union[MetaApplied, MetaRefused]


def meta_members(slot_map: SlotMap) -> tuple:
    """(voters, learners) of group 0 for a founding map: the META_VOTERS lowest node ids vote,
    the others learn (so every node answers routing from its own copy)."""
    ids = sorted(slot_map.nodes)
    return tuple(ids[:META_VOTERS]), tuple(ids[META_VOTERS:])


class MetaMachine:
    """The StateMachine (runtime/driver_api.py) of group 0."""

    def __init__(self, founding: SlotMap):
        self.slot_map = founding
        self._applied = 0
        self._listeners: list = []

    @property
    def applied_index(self) -> int:
        return self._applied

    def add_listener(self, callback: Callable[[SlotMap], None]) -> None:
        self._listeners.append(callback)

    def apply(self, index: int, data: bytes) -> MetaResult:
        invariant(index > self._applied, "entries apply in index order")
        self._applied = index
        try:
            change = decode_change(data)
            new_map = apply_change(self.slot_map, change)
        except (StaleEpoch, SlotMapError) as exc:
            return MetaRefused(exc, self.slot_map.epoch)
        self._set(new_map)
        return MetaApplied(new_map)

    def snapshot(self) -> bytes:
        return self.slot_map.encode()

    def restore(self, data: bytes, index: int) -> None:
        # SlotMapError here means a corrupt snapshot: the driver fail-stops the group.
        new_map = SlotMap.decode(bytes(data))
        self._applied = index
        self._set(new_map)

    def _set(self, new_map: SlotMap) -> None:
        self.slot_map = new_map
        for cb in self._listeners:
            try:
                cb(new_map)
            except Exception:  # a listener's bug must not fail-stop the metadata group
                log.exception("a slot map listener failed")
