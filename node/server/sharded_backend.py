"""ShardedBackend: the Backend protocol (backend.py) over the many data groups one node hosts.

    front ends (RESP, gRPC) -- submit / read / redirect_for / shards ...
        v
    ShardedBackend --- slot of the request's keys -> the slot map's group g ---> RaftBackend g
                                                                                (one per hosted group,
                                                                                 each its own GroupDriver
                                                                                 on the node's MultiRaft)

The front ends do not change: a request names keys of one slot (the routing
helper answers CROSSSLOT before; a request whose keys still span groups is
refused here with the same error), so it goes to exactly one group, and that
group's RaftBackend answers or raises as it would alone (NotLeader names the
leader of THAT group, with `group_id` and `slot` set for the gRPC ErrorDetail).
A group this node does not host (more nodes than replicas) is answered with its
preferred leader's address: the client follows it and is redirected again if
leadership is elsewhere.

Keyless commands follow a redis cluster primary, which answers for its own
slots: a node answers them for the groups it LEADS (docs/redis-differences.md).

    DBSIZE          the sum over those groups        KEYS     their keys, concatenated
    SCAN            one group at a time: the cursor is (engine cursor << 16) | group id,
                    0 when the last group is done
    FLUSHALL/DB,    proposed to each of those groups; the first error, else OK
    CONFIG SET
    PING, ECHO,     the lowest of those groups
    a keyless MULTI, NOOP
A node that leads no group answers a keyless command as the one-group node
answers on a follower: NotLeader naming the leader of slot 0's group. Reads
that may be stale (READONLY clients, INFO's key count) use every group this node
hosts instead.

The map follows the metadata group (node_main.py calls set_map on every applied change):
routing asks who_serves(map, slot). A slot frozen by a move (sealed at its source, not yet
decided) parks the request until the map moves on, at most PARK_S, then answers -TRYAGAIN
(redis's text; cluster clients retry it); a slot the map gives to a hosted group whose fsm
has not applied the slot's activation yet parks the same way. At most MAX_PARKED requests
wait at once; beyond that -TRYAGAIN at once.

At apply, each group's fsm refuses a keyed request for a slot it does not own
(fsm/slot_owner.py: the map may change between routing and commit); that
result is turned here into a MOVED to the leader of the slot's group now.
"""
from __future__ import annotations

import asyncio
import time
import dataclasses
from typing import Callable, Optional, Sequence

from ..cluster.slot_map import SlotMap
from ..cluster.slot_move import who_serves
from ..engine.cmd_slots import COUNT_KEYS_IN_SLOT, GET_KEYS_IN_SLOT
from ..engine.command_keys import command_keys
from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError
from ..engine.keyspace import EngineConfig
from ..engine.slots import key_slot
from ..fsm.entry import Kind
from ..fsm.slot_owner import not_owned_slot, request_keys
from ..invariant import invariant
from .backend import Backend, NodeInfo, NotLeader, Shard, cluster_node_id, split_address
from .raft_backend import RaftBackend
from .wire_errors import moved_message, try_again_message

CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"
SCAN_GROUP_BITS = 16             # group ids are uint16 (slot_map.MAX_GROUP_ID)
_FAN_OUT = frozenset((b"flushall", b"flushdb"))
# Internal keyless reads that name a slot in argv[1] (CLUSTER COUNTKEYSINSLOT/GETKEYSINSLOT):
# served by that slot's group.
_SLOT_READS = frozenset((COUNT_KEYS_IN_SLOT, GET_KEYS_IN_SLOT))
PARK_S = 0.5                     # how long a request to a moving slot waits for the move
PARK_POLL_S = 0.02               # re-check while parked (a data group's activation is not a map change)
MAX_PARKED = 10_000              # requests parked at once on this node


def _frozen(result) -> bool:
    """A data group's "slot frozen by a move" result (fsm SlotFrozen, docs/slot-move-steps.md):
    nothing was applied."""
    return isinstance(result, EngineError) and result.message.startswith("TRYAGAIN ")


class ShardedBackend(Backend):
    def __init__(self, raft_id: int, addresses: dict, slot_map: SlotMap, groups: dict):
        """`groups`: {group id: RaftBackend} of every group this node hosts (attached)."""
        invariant(all(g in slot_map.groups for g in groups), "hosted groups are in the map")
        self.raft_id = raft_id
        self.addresses = addresses            # node id -> NodeAddresses (config.py)
        self.groups: dict[int, RaftBackend] = dict(sorted(groups.items()))
        self._map_changed = asyncio.Event()
        self.parked = 0                   # requests waiting for a moving slot now
        self.set_map(slot_map)
        own = addresses[raft_id].resp
        self.node_id = cluster_node_id(own) if own else ""

    def add_group(self, group_id: int, backend: RaftBackend) -> None:
        """A group this node started replicating (membership: the map lists it now)."""
        self.groups = dict(sorted({**self.groups, group_id: backend}.items()))
        for callback in getattr(self, "_role_listeners", ()):
            backend.add_role_listener(callback)

    def remove_group(self, group_id: int) -> None:
        """A group this node left: its slots are redirected like any other group's."""
        self.groups = {g: b for g, b in self.groups.items() if g != group_id}

    # -- the map -----------------------------------------------------------------------------
    def set_map(self, slot_map: SlotMap) -> None:
        """Route by `slot_map` from now on (a newer map applied by the metadata group), and
        wake the parked requests to look again."""
        self.slot_map = slot_map
        self._ranges = {g: tuple(slot_map.ranges(g)) for g in slot_map.groups}
        self._map_changed.set()
        self._map_changed = asyncio.Event()

    def _slot_ready(self, slot: int) -> bool:
        gid, frozen = who_serves(self.slot_map, slot)
        if frozen:
            return False
        if self.slot_map.migration_of(slot) is None:
            return True                   # no move: the fsm's own check answers (MOVED if not owned)
        b = self.groups.get(gid)          # decided: the target, once its ACTIVATE applied here
        return b is None or b.sm.owned.owns(slot)

    async def _wait_serving(self, slot: int) -> None:
        """Park while `slot` is frozen by a move or not yet activated here (module doc)."""
        if self._slot_ready(slot):
            return
        if self.parked >= MAX_PARKED:
            raise EngineError(try_again_message())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PARK_S
        self.parked += 1
        try:
            while not self._slot_ready(slot):
                left = deadline - loop.time()
                if left <= 0:
                    raise EngineError(try_again_message())
                try:
                    async with asyncio.timeout(min(left, PARK_POLL_S)):
                        await self._map_changed.wait()
                except asyncio.TimeoutError:
                    pass
        finally:
            self.parked -= 1

    # -- routing ---------------------------------------------------------------------------
    def group_of_slot(self, slot: int) -> int:
        return self.slot_map.owner(slot)

    def _slot_of_keys(self, keys) -> Optional[int]:
        """The slot of the first key; CROSSSLOT when the keys fall in different groups."""
        slot = None
        group = None
        for k in keys:
            s = key_slot(bytes(k))
            if slot is None:
                slot, group = s, self.group_of_slot(s)
            elif s != slot and self.group_of_slot(s) != group:
                raise CommandError(CROSSSLOT)
        return slot

    def _not_hosted(self, slot: int) -> NotLeader:
        """A group this node has no replica of: its preferred leader is our best guess."""
        gid = self.group_of_slot(slot)
        pref = self.slot_map.groups[gid].preferred_leader
        a = self.addresses.get(pref)
        exc = NotLeader(a.resp if a is not None else None)
        exc.grpc_address = a.grpc if a is not None else None
        exc.leader_id, exc.group_id, exc.slot = pref, gid, slot
        return exc

    def _backend_for_slot(self, slot: int) -> RaftBackend:
        b = self.groups.get(self.group_of_slot(slot))
        if b is None:
            raise self._not_hosted(slot)
        return b

    def led(self) -> list:
        """The hosted groups this node leads, ascending."""
        return [b for b in self.groups.values() if b.is_leader()]

    def _keyless_targets(self, linearizable: bool = True) -> list:
        if not linearizable:
            return list(self.groups.values())
        led = self.led()
        if not led:
            raise self._keyless_not_leader()
        return led

    def _keyless_not_leader(self) -> NotLeader:
        b = self.groups.get(self.group_of_slot(0))
        if b is None:
            return self._not_hosted(0)
        exc = b._not_leader()
        exc.slot = 0
        return exc

    @staticmethod
    async def _on(b: RaftBackend, slot: Optional[int], call):
        try:
            return await call(b)
        except NotLeader as exc:
            # A copy: one NotLeader instance may fail every submit of a record (many slots).
            err = NotLeader(exc.leader_address)
            err.grpc_address = getattr(exc, "grpc_address", None)
            err.leader_id = getattr(exc, "leader_id", 0)
            err.group_id = getattr(exc, "group_id", b.group_id)
            err.slot = slot
            raise err from None

    # -- writes -----------------------------------------------------------------------------
    async def submit(self, requests: Sequence) -> list:
        requests = tuple(requests)
        if not requests:
            return []
        slot = None
        keyed = False
        for req in requests:
            keys = list(request_keys(req))
            if req.kind == Kind.REGISTER:
                keys_slot = req.route_slot if req.route_slot is not None else 0
            elif keys:
                keys_slot = self._slot_of_keys(keys)
            else:
                continue
            if slot is not None and self.group_of_slot(keys_slot) != self.group_of_slot(slot):
                raise CommandError(CROSSSLOT)      # one submit is one record of one group
            slot, keyed = keys_slot, True
        if keyed:
            await self._wait_serving(slot)
            b = self._backend_for_slot(slot)
            results = await self._on(b, slot, lambda b: b.submit(requests))
            if any(_frozen(r) for r in results):
                results = await self._retry_frozen(slot, requests, results)
            return [self._redirected(r) for r in results]
        return await self._submit_keyless(requests)

    async def _retry_frozen(self, slot: int, requests: tuple, results: list) -> list:
        """The group's fsm answered "frozen" (its seal applied before this node's map showed
        the move): those requests changed nothing and are not in the at-most-once table,
        so they are parked like any request to a moving slot and sent again, wherever the
        map then says, until PARK_S is spent. What is still frozen then stays -TRYAGAIN."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PARK_S
        results = list(results)
        while loop.time() < deadline:
            frozen = [i for i, r in enumerate(results) if _frozen(r)]
            if not frozen:
                break
            await asyncio.sleep(PARK_POLL_S)       # the seal is there: the map is on its way
            try:
                await self._wait_serving(slot)
                b = self._backend_for_slot(slot)
            except (EngineError, NotLeader):
                break                              # parked too long, or now served elsewhere
            again = await self._on(b, slot, lambda b: b.submit([requests[i] for i in frozen]))
            for i, r in zip(frozen, again):
                results[i] = r
        return results

    async def _submit_keyless(self, requests: tuple) -> list:
        targets = self._keyless_targets()
        fan_out = all(r.kind == Kind.CONFIG or (r.kind == Kind.COMMAND and bytes(r.argv[0]).lower() in _FAN_OUT)
                      for r in requests)
        if not fan_out:
            return await targets[0].submit(requests)
        per_group = await asyncio.gather(*(b.submit(requests) for b in targets))
        out = []
        for i in range(len(requests)):
            errors = [res[i] for res in per_group if isinstance(res[i], EngineError)]
            out.append(errors[0] if errors else per_group[0][i])
        return out

    def _redirected(self, result):
        """A SlotNotOwned result as a MOVED to the slot's owner now (module doc)."""
        slot = not_owned_slot(result)
        if slot is None:
            return result
        target = self.redirect_for(slot)
        return EngineError(moved_message(slot, target)) if target else result

    # -- reads ------------------------------------------------------------------------------
    async def read(self, argv, linearizable: bool = True):
        if bytes(argv[0]).lower() in _SLOT_READS:
            slot = int(argv[1])            # cluster_cmds.slot_read validated it (0..16383)
            await self._wait_serving(slot)
            return await self._on(self._backend_for_slot(slot), slot, lambda b: b.read(argv, linearizable))
        try:
            spec = lookup([bytes(a) for a in argv])
        except EngineError as e:
            return e
        keys = command_keys(spec, argv)
        if keys:
            slot = self._slot_of_keys(keys)
            await self._wait_serving(slot)
            b = self._backend_for_slot(slot)
            # The fsm refuses reads of slots it no longer owns (a move released them): MOVED.
            return self._redirected(await self._on(b, slot, lambda b: b.read(argv, linearizable)))
        targets = self._keyless_targets(linearizable)
        name = spec.name
        if name == "scan":
            return await self._scan(targets, argv, linearizable)
        if name not in ("dbsize", "keys"):
            return await targets[0].read(argv, linearizable)
        replies = await asyncio.gather(*(b.read(argv, linearizable) for b in targets))
        for r in replies:
            if isinstance(r, EngineError):
                return r
        if name == "dbsize":
            return sum(replies)
        return [k for r in replies for k in r]

    async def _scan(self, targets: list, argv, linearizable: bool):
        raw = bytes(argv[1])
        if not raw.isdigit() or len(raw) > 20:
            return await targets[0].read(argv, linearizable)    # the engine's own error or reading
        cursor = int(raw)
        ids = [b.group_id for b in targets]
        gid, engine_cursor = cursor & ((1 << SCAN_GROUP_BITS) - 1), cursor >> SCAN_GROUP_BITS
        if cursor == 0:
            gid = ids[0]
        elif gid not in ids:
            # Leadership moved since the last call: go on with the next group we lead.
            later = [g for g in ids if g > gid]
            if not later:
                return [b"0", []]
            gid, engine_cursor = later[0], 0
        b = self.groups[gid]
        reply = await b.read([argv[0], b"%d" % engine_cursor] + list(argv[2:]), linearizable)
        if isinstance(reply, EngineError):
            return reply
        nxt, keys = reply
        if int(nxt) != 0:
            return [b"%d" % ((int(nxt) << SCAN_GROUP_BITS) | gid), keys]
        later = [g for g in ids if g > gid]
        return [b"%d" % later[0] if later else b"0", keys]     # the next group from its start

    # -- listeners, role, routing ---------------------------------------------------------------
    def add_ready_listener(self, callback: Callable[[frozenset], None]) -> None:
        for b in self.groups.values():
            b.add_ready_listener(callback)

    def add_role_listener(self, callback: Callable[[], None]) -> None:
        self._role_listeners = getattr(self, "_role_listeners", []) + [callback]   # groups added later too
        for b in self.groups.values():
            b.add_role_listener(callback)

    def now_ms(self) -> int:
        if not self.groups:               # hosts no group yet: the local clock
            return int(time.time() * 1000)
        return next(iter(self.groups.values())).now_ms()

    def is_leader(self) -> bool:
        """Leads at least one group (HELLO's and INFO's role: a redis primary of some slots)."""
        return any(b.is_leader() for b in self.groups.values())

    def leader_address(self) -> Optional[str]:
        if self.is_leader():
            return self.addresses[self.raft_id].resp
        b = self.groups.get(self.group_of_slot(0))
        return b.leader_address() if b is not None else None

    def hosts_slot(self, slot: int) -> bool:
        return self.group_of_slot(slot) in self.groups

    def redirect_for(self, slot: int) -> Optional[str]:
        b = self.groups.get(self.group_of_slot(slot))
        if b is not None:
            return b.redirect_for(slot)
        return self._not_hosted(slot).leader_address or ""

    def advertise(self, host: str, port: int) -> None:
        for b in self.groups.values():
            b.advertise(host, port)
        if not self.groups:               # a node that hosts no group yet (joined, not added)
            a = self.addresses[self.raft_id]
            if a.resp is None:
                a = type(a)(a.grpc, "%s:%d" % (host, port))
        else:
            a = next(iter(self.groups.values())).addresses[self.raft_id]     # with the RESP port bound
        self.addresses = {**self.addresses, self.raft_id: a}
        if a.resp:
            self.node_id = cluster_node_id(a.resp)

    def applied_index(self, keys=()) -> int:
        """The applied index of the group of `keys` (WATCH compares it with that group's
        key versions); without keys, the lowest hosted group's."""
        slot = self._slot_of_keys(keys) if keys else None
        b = self.groups.get(self.group_of_slot(slot)) if slot is not None else None
        b = b or next(iter(self.groups.values()), None)
        return b.sm.applied_index if b is not None else 0

    def shards(self) -> list:
        """One Shard per group of the map, every slot covered: a hosted group as its replica
        sees it (no leader known: its preferred leader stands in), another from the map."""
        out = []
        for gid, spec in sorted(self.slot_map.groups.items()):
            ranges = self._ranges[gid]
            if not ranges:
                continue
            b = self.groups.get(gid)
            shard = b.shard(ranges, spec.preferred_leader) if b is not None else None
            if shard is None:
                shard = self._static_shard(ranges, spec)
            if shard is not None:
                out.append(dataclasses.replace(shard, epoch=self.slot_map.epoch))
        return out

    def _static_shard(self, ranges: tuple, spec) -> Optional[Shard]:
        nodes = []
        for nid in [spec.preferred_leader] + [v for v in spec.voters if v != spec.preferred_leader]:
            a = self.addresses.get(nid)
            if a is None or not a.resp:
                continue
            host, port = split_address(a.resp)
            nodes.append(NodeInfo(cluster_node_id(a.resp), host, port,
                                  "master" if nid == spec.preferred_leader else "slave",
                                  myself=nid == self.raft_id))
        return Shard(ranges, tuple(nodes)) if nodes and nodes[0].role == "master" else None

    def leaders(self) -> dict:
        """{group id: (leader id, term)} this node knows, for every hosted group."""
        return {gid: b.leader_term() for gid, b in self.groups.items()}

    def raft_info(self) -> dict:
        """INFO's Raft section: the node, then one line per hosted group, as redis lists
        its replicas (slave0:ip=...,port=...)."""
        led = [gid for gid, b in self.groups.items() if b.is_leader()]
        out = {
            "raft_node_id": self.raft_id,
            "raft_role": "leader" if led else "follower",
            "raft_groups": len(self.slot_map.groups),
            "raft_groups_hosted": ",".join(str(g) for g in self.groups),
            "raft_groups_led": ",".join(str(g) for g in led),
            # Hosted groups asleep (node/raft/quiesce.py): idle, no ticks, no heartbeats.
            "raft_groups_quiesced": sum(1 for b in self.groups.values()
                                        if b.driver is not None and b.driver.rn.quiesced),
            "raft_slot_map_epoch": self.slot_map.epoch,
            "raft_log_cache_bytes": 0,          # the storage's memory, summed over hosted groups
            "raft_snapshot_cache_bytes": 0,
        }
        host = next((b.driver.host for b in self.groups.values() if b.driver is not None), None)
        if host is not None:
            # The node loop's counters (runtime/multiraft.py LoopStats): peer batches sent per
            # loop iteration, commit-only appends held and superseded, etc.
            for name, value in vars(host.stats).items():
                out["raft_loop_" + name] = value
        for gid, b in self.groups.items():
            i = b.raft_info()
            for k in ("raft_log_cache_bytes", "raft_snapshot_cache_bytes"):
                out[k] += i.get(k, 0)
            out["raft_group%d" % gid] = ",".join("%s=%s" % kv for kv in (
                ("role", i.get("raft_role", "follower")), ("leader_id", i.get("raft_leader_id", 0)),
                ("term", i.get("raft_term", 0)), ("commit_index", i.get("raft_commit_index", 0)),
                ("applied_index", i.get("raft_applied_index", 0)), ("writable", i.get("raft_writable", 0)),
                ("slots", self._ranges_text(gid))))
        return out

    def _ranges_text(self, gid: int) -> str:
        return "/".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in self._ranges[gid])

    def engine_config(self) -> EngineConfig:
        led = self.led()
        b = led[0] if led else next(iter(self.groups.values()), None)
        return b.sm.keyspace.config if b is not None else EngineConfig()

