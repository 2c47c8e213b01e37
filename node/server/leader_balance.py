"""Leaders spread over the nodes: each group's leader hands leadership to the group's
preferred leader (the slot map's, placement.py: group i prefers node i mod N).

Elections put leaders wherever the first timeout fired, often all on one node;
the map says where each should be. Every `interval_s`, for each group THIS node
leads (only a leader acts, so two nodes never pull one group in two directions)
whose preferred leader is another node, the balancer transfers leadership there
when all of these hold:

  - this node is a settled leader (its warm-up commit is applied: writable);
  - the preferred node is a voter of the group, recently active (it answered this
    term's heartbeats: it is up) and caught up (its match index within
    CATCH_UP_SLACK entries of our last index; Raft's transfer then waits for the rest);
  - no transfer of this group was started in the last `cooldown_s`.

A manual transfer (`xraftctl leader transfer`, admin_rpcs.py) is an operator's
override: every node the request reaches records the target as the group's
preferred leader here (`set_override`), in memory only. The balancer then keeps
the group where the operator put it (and moves it back there after a failover)
instead of pulling it to the slot map's choice. A transfer to the slot map's
preferred leader clears the override; a restart forgets it.

Never fighting: the preferred node, once leader, never transfers (it is where the
group belongs), and a preferred node that keeps failing is retried at most once
per cooldown. A transfer costs the group about one round trip without a leader
(writes arriving meanwhile are refused unproposed, retriable; those already in the log are on the
target, caught up before it campaigns, and end with their result once it commits
them: raft_driver._check_leadership).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..cluster.slot_map import SlotMap

log = logging.getLogger("xraft.balance")

CATCH_UP_SLACK = 64
TRANSFER_TIMEOUT_S = 2.0


class LeaderBalancer:
    def __init__(self, raft_id: int, slot_map: SlotMap, backends: dict, *, interval_s: float,
                 cooldown_s: float, clock: Callable[[], float] | None = None):
        self.raft_id = raft_id
        self.slot_map = slot_map
        self.backends = backends                 # {group id: RaftBackend}, attached
        self.interval_s = interval_s
        self.cooldown_s = cooldown_s
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._last_try: dict[int, float] = {}
        self.overrides: dict[int, int] = {}      # group id -> node an operator chose (module doc)
        self.transfers = 0                       # started (INFO, tests)

    def preferred(self, gid: int) -> int:
        """The node the group's leadership belongs on: the operator's override, else the map's."""
        return self.overrides.get(gid, self.slot_map.groups[gid].preferred_leader)

    def set_override(self, gid: int, node_id: int) -> None:
        if node_id == self.slot_map.groups[gid].preferred_leader:
            self.overrides.pop(gid, None)
        else:
            self.overrides[gid] = node_id

    def candidates(self) -> list:
        """[(group id, preferred node)] transfers that may start now (module doc)."""
        now = self._clock()
        out = []
        for gid, b in self.backends.items():
            pref = self.preferred(gid)
            if pref == self.raft_id or not b.writable():
                continue
            last = self._last_try.get(gid)
            if last is not None and now - last < self.cooldown_s:
                continue
            d = b.driver
            pr = d.raft_status().progress.get(b.replica_of(pref))
            if pr is None or pr.is_learner or not pr.recent_active:
                continue
            if d.status().last_index - pr.match > CATCH_UP_SLACK:
                continue
            out.append((gid, pref))
        return out

    async def step(self) -> None:
        for gid, pref in self.candidates():
            self._last_try[gid] = self._clock()
            self.transfers += 1
            log.info("group %d: handing leadership to its preferred leader, node %d", gid, pref)
            try:
                async with asyncio.timeout(TRANSFER_TIMEOUT_S):
                    b = self.backends[gid]
                    await b.driver.transfer_leader(b.replica_of(pref))
            except Exception as exc:  # noqa: BLE001 - a courtesy: the group works wherever its leader is
                log.info("group %d: leadership transfer to node %d not started: %r", gid, pref, exc)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.step()
