"""The node's member of the metadata group (Raft group 0, cluster/meta_machine.py).

    DATA/group-0       its WAL and snapshots, like any group's
    founding state     the epoch-1 map of DATA/slot-map.json (slot_map_store.py), written by
                       the bootstrap as group 0's snapshot at index 1 whenever DATA/group-0 is
                       empty. Every founding node computes the same map, so a node that opens
                       group 0 later than the others (a data dir from before the metadata
                       group) starts from the same first snapshot and is caught up by the
                       leader like a lagging member.
    members            voters: the 3 lowest node ids of the founding map; learners: the others;
                       later the membership reconciler keeps 3 UP voters and every other node
                       that is not REMOVED a learner (membership.py, meta_members_wanted)

Every node, `--groups 1` included, runs one: the map's epoch and its migrations are read
from it everywhere (a one-group cluster can have no move, its map changes only by operator
changes such as AddNode).

open() returns once the entries its disk holds as committed are applied again and, on a
restart, once it caught up with the leader's commit (a read index; at most CATCH_UP_S, so a
node alone still starts): a commit index saved without fsync (raft_driver.py) could otherwise
make it route by a map a little older than the one it served before the restart. Clients
that watch the map ignore an epoch older than one they saw (ops/slots_cli.py). Listeners hear every later map, on the loop thread (MetaMachine.add_listener).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

from ..cluster.changes import encode_change
from ..cluster.meta_machine import META_GROUP_ID, MetaMachine, MetaResult, meta_members
from ..cluster.slot_map import SlotMap
from ..runtime.multiraft import MultiRaft
from ..runtime.raft_driver import DriverError, GroupDriver

log = logging.getLogger("xraft.meta")

REPLAY_WAIT_S = 10.0      # open(): the local log's committed entries re-apply within this
REPLAY_POLL_S = 0.01
CATCH_UP_S = 3.0          # open(): a restarted member then waits this long at most for the leader's commit


class MetaGroup:
    def __init__(self, founding: SlotMap):
        self.founding = founding
        self.machine = MetaMachine(founding)
        self.driver: Optional[GroupDriver] = None
        self._changed = asyncio.Event()

    async def open(self, mr: MultiRaft, data_dir: str, bootstrap: bool = True) -> None:
        """bootstrap=False (a node that joined an existing cluster, --join): an empty group 0
        waits for the leader's snapshot. The founding snapshot is written only from an epoch-1
        map, the one every founding node computes: any other map at index 1 would differ from
        the other members' entry 1."""
        voters, learners = meta_members(self.founding)
        if not bootstrap or self.founding.epoch != 1:
            voters, learners = (), ()
        self.driver = await mr.add_group(META_GROUP_ID, data_dir, self.machine, bootstrap_voters=voters,
                                         bootstrap_learners=learners)
        # Added after the open: its snapshot restore ran in a thread, before any listener.
        self.machine.add_listener(self._on_map)
        commit = self.driver.status().commit
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLAY_WAIT_S
        while self.driver.applied < commit and loop.time() < deadline and self.driver.failed is None:
            await asyncio.sleep(REPLAY_POLL_S)
        if self.driver.applied < commit:
            log.warning("metadata group: %d of %d committed entries re-applied after %.0fs; starting "
                        "with the map of epoch %d", self.driver.applied, commit, REPLAY_WAIT_S,
                        self.slot_map.epoch)
        if commit > 1:
            await self._catch_up(loop)

    async def _catch_up(self, loop) -> None:
        """A restarted member: what its disk holds as committed may be a little behind what
        it had applied (commit indexes are saved without fsync), so before the node routes,
        catch up with the leader's commit (a read index), for at most CATCH_UP_S."""
        deadline = loop.time() + CATCH_UP_S
        while loop.time() < deadline and self.driver.failed is None:
            try:
                await self.driver.read_index(timeout=max(0.05, deadline - loop.time()))
                return
            except DriverError:
                await asyncio.sleep(REPLAY_POLL_S * 5)      # no leader yet: an election is under way
        log.info("metadata group: not caught up with a leader within %.0fs; starting with the map of "
                 "epoch %d (newer ones arrive by replication)", CATCH_UP_S, self.slot_map.epoch)

    @property
    def slot_map(self) -> SlotMap:
        return self.machine.slot_map

    def add_listener(self, callback: Callable[[SlotMap], None]) -> None:
        self.machine.add_listener(callback)

    def _on_map(self, _m: SlotMap) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        """Until the next map (or `timeout`)."""
        try:
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        except asyncio.TimeoutError:
            pass

    def is_leader(self) -> bool:
        d = self.driver
        return d is not None and d.failed is None and d.is_leader()

    def leader_id(self) -> int:
        return self.driver.status().leader_id if self.driver is not None else 0

    async def propose(self, change, timeout: float) -> MetaResult:
        """Propose one change; its MetaApplied/MetaRefused once applied here. Raises the
        driver's NotLeader, ProposalDropped, UnknownOutcome (the change may have committed:
        the caller reads the map and asks changes.already_applied)."""
        return await self.driver.propose(encode_change(change), timeout)
