"""The seeded sharded-cluster simulation: N nodes, a metadata group and two data groups, each
replica the REAL Raft core and the REAL state machine, a driver moving slots back and forth,
clients writing and consuming streams, under drops, delays, duplicates, partitions, crashes.

One RNG (`random.Random(seed)`) drives everything; each step runs one event chosen at random:

  deliver   one due message (loss, duplication, partitions: as tests/raft/sim/network.py)
  write     a replica takes its Ready and writes it (messages go out at once)
  sync      a replica makes its Ready durable, sends persisted_messages, applies
  tick      every replica of every up node (each node may miss a tick)
  call      an actor (driver or client) issues its pending call
  fault     crash / restart a node, partition / heal, a campaign

Calls complete when the leader's replica applies the proposal (or answers the ReadIndex);
a crash, a partition between caller and leader, or `call_timeout` steps make them
Unavailable (outcome unknown). The checker (checker.py) runs after every first application
of a log index and at the end. Phase 2 heals everything, lets the driver finish every move
and the clients finish their last request, then checks the final state.
"""
from __future__ import annotations

import collections
import random
from dataclasses import dataclass, replace

from xraft.node.cluster.placement import initial_layout
from xraft.node.cluster.slot_map import NodeSpec
from xraft.node.engine.slots import key_slot
from xraft.node.fsm.entry import Request, encode_record
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import MessageType as MT, ProposalDropped

from .actors import Actor, NotSent, Propose, Unavailable
from .checker import Checker
from .clients import GROUP, Client, Ledger
from .driver import Driver
from .replica import META, Replica, bootstrap_snapshot

TRACE_LEN = 120
MAX_IN_FLIGHT = 4000
BASE_MS = 1_700_000_000_000
SETTLE_MAX = 150_000     # the moves the operator still wants run in the healing phase too (a pre-copy adds rounds)


@dataclass(frozen=True)
class ShardSimConfig:
    nodes: int = 4
    steps: int = 3000
    clients: int = 3
    moves: int = 3                 # moves the operator starts (alternating direction)
    election_tick: int = 20
    heartbeat_tick: int = 2
    max_delay: int = 3
    drop_rate: float = 0.0
    dup_rate: float = 0.0
    w_crash: float = 0.0
    w_partition: float = 0.0
    w_campaign: float = 0.0
    log_bound: int = 32
    snapshot_chunk_bytes: int = 1 << 20
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    chunk_bytes: int = 256          # export chunk (MoveSteps max_bytes)
    move_timeout: int = 4000        # steps before DECIDED, then Abort("timeout")
    call_timeout: int = 400         # steps a call waits for its answer
    give_up: int = 4                # XADD attempts before the outcome is called unknown
    inject: frozenset = frozenset()  # checker self-tests only: deliberate driver bugs

    def describe(self) -> str:
        return ("nodes=%d steps=%d clients=%d moves=%d delay<=%d drop=%s dup=%s crash=%s partition=%s "
                "campaign=%s log_bound=%d snap_chunk=%d msg_bytes=%d inflight=%d chunk=%d move_timeout=%d "
                "call_timeout=%d give_up=%d" % (
                    self.nodes, self.steps, self.clients, self.moves, self.max_delay, self.drop_rate,
                    self.dup_rate, self.w_crash, self.w_partition, self.w_campaign, self.log_bound,
                    self.snapshot_chunk_bytes, self.max_size_per_msg, self.max_inflight_msgs, self.chunk_bytes,
                    self.move_timeout, self.call_timeout, self.give_up)
                + (" inject=%s" % sorted(self.inject) if self.inject else ""))


def config_for_seed(seed: int, steps: int = 3000, **overrides) -> ShardSimConfig:
    """Swarm testing: the seed picks the size, the faults and how hard they hit."""
    r = random.Random(seed ^ 0x5A4D)
    on = lambda p, hi: r.choice((hi * 0.3, hi)) if r.random() < p else 0.0  # noqa: E731
    cfg = ShardSimConfig(
        nodes=r.choice((4, 5)), steps=steps, clients=r.randint(3, 6), moves=r.randint(2, 4),
        max_delay=r.randint(0, 5), drop_rate=r.choice((0.0, 0.0, 0.02, 0.1)),
        dup_rate=r.choice((0.0, 0.0, 0.02, 0.1)),
        w_crash=on(0.6, 0.01), w_partition=on(0.6, 0.01), w_campaign=on(0.3, 0.005),
        log_bound=r.choice((8, 32, 128)), snapshot_chunk_bytes=r.choice((256, 1 << 20)),
        max_size_per_msg=r.choice((512, 1 << 20)), max_inflight_msgs=r.choice((4, 256)),
        chunk_bytes=r.choice((64, 256, 4096)), move_timeout=r.choice((600, 2500, 10 ** 9)),
        call_timeout=r.choice((150, 400, 1000)), give_up=r.choice((1, 3, 8)))
    return replace(cfg, **overrides)


def repro_command(seed: int, steps: int) -> str:
    return "XRAFT_SIM_SEED=%d XRAFT_SIM_STEPS=%d python -m pytest tests/raft/test_shardsim.py -q" % (seed, steps)


class ShardSimFailure(AssertionError):
    def __init__(self, seed: int, cfg: ShardSimConfig, reason: str, trace: list):
        lines = ["shard simulation failed: %s" % reason, "seed=%d config: %s" % (seed, cfg.describe()),
                 "reproduce: %s" % repro_command(seed, cfg.steps), "last %d events:" % len(trace)] + trace
        super().__init__("\n".join(lines))
        self.seed, self.reason = seed, reason


class SimNode:
    def __init__(self, node_id: int):
        self.id = node_id
        self.crashed = False
        self.replicas: dict = {}        # gid -> Replica


class ShardSim:
    def __init__(self, seed: int, cfg: ShardSimConfig):
        self.seed, self.cfg = seed, cfg
        self.rng = random.Random(seed)
        self.now = 0
        self.trace = collections.deque(maxlen=TRACE_LEN)
        self.in_flight: list = []              # [due, gid, msg]
        self.blocked: set = set()              # directed (frm, to) node links that lose everything
        self.stats = collections.Counter()
        ids = list(range(1, cfg.nodes + 1))
        self.founding = initial_layout({n: NodeSpec(n, "sim:%d" % n) for n in ids}, groups=2)
        self.keys, self.move_ranges = self._pick_keys()
        self.moves_wanted = cfg.moves
        self.moves_begun = 0
        self.workload_on = True
        self.ledger = Ledger()
        self.checker = Checker(self)
        self.nodes = {n: SimNode(n) for n in ids}
        self._up = None                        # replicas() cache
        self.pending_props: dict = {}          # (node, gid, index) -> (term, actor, token)
        self.pending_reads: dict = {}          # (node, gid, ctx) -> [actor, token, fn, read index or None]
        self.read_seq = 0
        members = {META: tuple(ids[:3])}
        members.update({gid: spec.voters for gid, spec in self.founding.groups.items()})
        self.frontier = {gid: 1 for gid in members}
        for gid, voters in members.items():
            setup = self._setup_record(gid) if gid != META else None
            snap = bootstrap_snapshot(gid, self.founding, voters, setup)
            for n in voters:
                st = MemoryStorage()
                st.apply_snapshot(snap)
                st.sync()
                self.nodes[n].replicas[gid] = Replica(self, n, gid, st)
        self.drivers: dict = {}                # node -> Actor
        self.clients = [Actor("client%d" % c, Client(self, c).run()) for c in range(1, cfg.clients + 1)]
        for a in self.clients:
            a.resume(self.now)
        self.checker.start()

    # -- the keys: two hash tags whose slots move, one staying key per group -----------------------
    def _pick_keys(self) -> tuple:
        g1_last = self.founding.ranges(1)[0][1]
        tags, stay = [], {}
        i = 0
        while len(tags) < 2 or len(stay) < 2:
            tag = b"{t%d}" % i
            s = key_slot(tag)
            gid = 1 if s <= g1_last else 2
            if len(tags) < 2 and gid == 1 and all(key_slot(t) != s for t in tags):
                tags.append(tag)
            elif gid not in stay:
                stay[gid] = tag
            i += 1
        keys = [t + b"s%d" % j for t in tags for j in range(2)] + [stay[1] + b"s", stay[2] + b"s"]
        ranges = [(key_slot(t), key_slot(t)) for t in tags]
        return keys, ranges

    def _setup_record(self, gid: int) -> bytes:
        """Every stream exists from the start with the consumer group (in its owner's founding state)."""
        reqs = [Request.command(0, 0, (b"XGROUP", b"CREATE", k, GROUP, b"$", b"MKSTREAM"))
                for k in self.keys if self.founding.owner(key_slot(k)) == gid]
        return encode_record(BASE_MS, reqs)

    def now_ms(self) -> int:
        return BASE_MS + self.now * 10

    # -- access ---------------------------------------------------------------------------------
    def replica(self, node: int, gid: int):
        n = self.nodes[node]
        return None if n.crashed else n.replicas.get(gid)

    def replicas(self, gid=None) -> list:
        """The replicas of up nodes (of group `gid`); cached, rebuilt at each crash and restart."""
        if self._up is None:
            self._up = {None: []}
            for n in self.nodes.values():
                if not n.crashed:
                    for g, r in n.replicas.items():
                        self._up[None].append(r)
                        self._up.setdefault(g, []).append(r)
        return self._up.get(gid, [])

    def any_node_map(self, current):
        """A client's map refresh: some up node's applied map (never older than `current`)."""
        ups = [r for r in self.replicas(META)]
        if not ups:
            return current
        m = self.rng.choice(ups).machine.slot_map
        return m if current is None or m.epoch >= current.epoch else current

    def trace_event(self, *parts) -> None:
        self.trace.append("%6d %s" % (self.now, " ".join(str(p) for p in parts)))

    def reachable(self, a, b) -> bool:
        return a is None or a == b or ((a, b) not in self.blocked and (b, a) not in self.blocked)

    # -- network --------------------------------------------------------------------------------
    def send(self, gid: int, m) -> None:
        self.in_flight.append([self.now + self.rng.randint(0, self.cfg.max_delay), gid, m])
        if len(self.in_flight) > MAX_IN_FLIGHT:
            _, g, lost = self.in_flight.pop(0)
            self._lost(g, lost)

    def _lost(self, gid: int, m) -> None:
        """Like a real transport, tell a sender that its snapshot stream broke (else it waits forever)."""
        src = self.replica(m.frm, gid) if m.frm in self.nodes else None
        if src is not None and m.type == MT.SNAP:
            src.rn.report_snapshot(m.to, False)

    def deliver(self, pos: int) -> None:
        _, gid, m = self.in_flight.pop(pos)
        dst = self.replica(m.to, gid)
        src = self.replica(m.frm, gid) if m.frm in self.nodes else None
        if dst is None or (m.frm, m.to) in self.blocked:
            if src is not None:
                src.rn.report_unreachable(m.to)     # a broken link is seen; a random loss is not
            self._lost(gid, m)
            return
        if self.cfg.drop_rate and self.rng.random() < self.cfg.drop_rate:
            self._lost(gid, m)
            return
        if self.cfg.dup_rate and self.rng.random() < self.cfg.dup_rate:
            self.in_flight.append([self.now + self.rng.randint(1, self.cfg.max_delay + 1), gid, m])
        dst.rn.step(m)
        if m.type == MT.SNAP and m.chunk_offset + len(m.snapshot.data) == m.chunk_total and src is not None:
            src.rn.report_snapshot(m.to, True)

    # -- calls ------------------------------------------------------------------------------------
    def leader_for(self, gid: int, via, local: bool):
        if local:
            r = self.replica(via, gid)
            return r if r is not None and r.is_leader() else None
        leads = [r for r in self.replicas(gid) if r.is_leader() and self.reachable(via, r.node_id)]
        return max(leads, key=lambda r: r.rn.raft.term) if leads else None

    def issue(self, actor: Actor) -> None:
        call = actor.call
        r = self.leader_for(call.gid, call.via, getattr(call, "local", False))
        self.stats["calls"] += 1
        if r is None:
            self.stats["no_leader"] += 1
            actor.resume(self.now, exc=NotSent("group %d: no leader reachable" % call.gid))
            return
        actor.state, actor.deadline = "waiting", self.now + self.cfg.call_timeout
        if isinstance(call, Propose):
            try:
                r.rn.propose(call.data)
            except ProposalDropped as exc:
                actor.resume(self.now, exc=NotSent(str(exc)))
                return
            log = r.rn.raft.raft_log
            self.pending_props[(r.node_id, r.gid, log.last_index())] = (r.rn.raft.term, actor, actor.token)
        else:
            self.read_seq += 1
            ctx = b"r%d" % self.read_seq
            self.pending_reads[(r.node_id, r.gid, ctx)] = [actor, actor.token, call.fn, None]
            r.rn.read_index(ctx)

    def _complete(self, actor: Actor, token: int, node: int, value=None, exc=None) -> None:
        if actor.token != token or actor.state != "waiting":
            return                                    # timed out already, or a dead driver
        if not self.reachable(actor.call.via, node):
            return                                    # the answer is lost: the caller times out
        actor.resume(self.now, value, exc)

    def before_apply(self, r: Replica, e) -> None:
        if e.index > self.frontier[r.gid] and r.gid != META:
            self.checker.before_first_apply(r, e)

    def on_applied(self, r: Replica, e, result) -> None:
        if e.index > self.frontier[r.gid]:
            self.frontier[r.gid] = e.index
            self.checker.on_first_apply(r, e, result)
        p = self.pending_props.pop((r.node_id, r.gid, e.index), None)
        if p is not None:
            term, actor, token = p
            if term == e.term:
                self._complete(actor, token, r.node_id, result)
            else:
                self._complete(actor, token, r.node_id, exc=Unavailable("proposal lost (term %d)" % term))

    def on_read_state(self, r: Replica, rs) -> None:
        p = self.pending_reads.get((r.node_id, r.gid, rs.request_ctx))
        if p is not None:
            p[3] = rs.index

    def after_apply(self, r: Replica) -> None:
        for key in [k for k, p in self.pending_reads.items() if k[0] == r.node_id and k[1] == r.gid]:
            actor, token, fn, index = self.pending_reads[key]
            if index is None or r.machine.applied_index < index:
                continue
            del self.pending_reads[key]
            try:
                value = fn(r.machine.sm)
            except Exception as exc:  # noqa: BLE001 - MoveRefused and the like go to the caller
                self._complete(actor, token, r.node_id, exc=exc)
            else:
                self._complete(actor, token, r.node_id, value)

    # -- faults -----------------------------------------------------------------------------------
    def crash(self, node: SimNode) -> None:
        self.trace_event("crash", node.id)
        node.crashed = True
        self._up = None
        for r in node.replicas.values():
            r.crash()
        lost = [f for f in self.in_flight if f[2].to == node.id]
        self.in_flight = [f for f in self.in_flight if f[2].to != node.id]
        for _, gid, m in lost:
            self._lost(gid, m)
        self._fail_node_calls(node.id)
        d = self.drivers.pop(node.id, None)
        if d is not None:
            d.close()

    def _fail_node_calls(self, node_id: int) -> None:
        for key in [k for k in self.pending_props if k[0] == node_id]:
            _, actor, token = self.pending_props.pop(key)
            self._complete(actor, token, None, exc=Unavailable("node %d crashed" % node_id))
        for key in [k for k in self.pending_reads if k[0] == node_id]:
            actor, token, _, _ = self.pending_reads.pop(key)
            self._complete(actor, token, None, exc=Unavailable("node %d crashed" % node_id))

    def restart(self, node: SimNode) -> None:
        self.trace_event("restart", node.id)
        node.crashed = False
        self._up = None
        for r in node.replicas.values():
            r.start()

    def fault(self) -> None:
        c, rng = self.cfg, self.rng
        kinds = [(k, w) for k, w in (("crash", c.w_crash), ("partition", c.w_partition),
                                      ("campaign", c.w_campaign)) if w > 0]
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        nodes = sorted(self.nodes)
        if kind == "crash":
            down = [n for n in nodes if self.nodes[n].crashed]
            if down and (rng.random() < 0.6 or len(down) >= 2):
                self.restart(self.nodes[rng.choice(down)])
            else:
                node = self.nodes[rng.choice(nodes)]
                if not node.crashed:
                    self.crash(node)
        elif kind == "partition":
            if self.blocked and rng.random() < 0.5:
                self.blocked.clear()
                self.trace_event("heal")
            else:
                group = set(rng.sample(nodes, rng.randint(1, len(nodes) // 2)))
                one_way = rng.random() < 0.3
                for a in group:
                    for b in set(nodes) - group:
                        self.blocked.add((a, b))
                        if not one_way:
                            self.blocked.add((b, a))
                self.trace_event("partition", sorted(group), "one-way" if one_way else "")
        else:
            ups = list(self.replicas())
            if ups:
                r = rng.choice(ups)
                self.trace_event("campaign", r.node_id, "group", r.gid)
                r.rn.campaign()

    # -- the scheduler ----------------------------------------------------------------------------
    def actors(self) -> list:
        return list(self.drivers.values()) + self.clients

    def _spawn_drivers(self) -> None:
        for nid, a in list(self.drivers.items()):
            if a.state == "done":
                del self.drivers[nid]
        for r in self.replicas(META):
            if r.is_leader() and r.node_id not in self.drivers:
                a = Actor("driver@%d" % r.node_id, Driver(self, r.node_id).run(), node=r.node_id)
                self.drivers[r.node_id] = a
                a.resume(self.now)

    def step_once(self, faults: bool) -> None:
        self.now += 1
        rng = self.rng
        self._spawn_drivers()
        reps = list(self.replicas())
        writers = [r for r in reps if r.pending is None and r.rn.has_ready()]
        syncers = [r for r in reps if r.pending is not None]
        due = [i for i, f in enumerate(self.in_flight) if f[0] <= self.now]
        for a in self.actors():
            if a.state == "sleep" and a.wake_at <= self.now:
                a.resume(self.now)
            elif a.state == "waiting" and a.deadline <= self.now:
                self.stats["timeouts"] += 1
                self.stats["timeout_%s_g%d" % (type(a.call).__name__, a.call.gid)] += 1
                a.resume(self.now, exc=Unavailable("timeout"))
        callers = [a for a in self.actors() if a.state == "queued"]
        cats = []
        if due:
            cats.append(("deliver", 2.0 + len(due)))
        if writers:
            cats.append(("write", 2.0 * len(writers)))
        if syncers:
            cats.append(("sync", 2.0 * len(syncers)))
        if callers:
            cats.append(("call", 2.0 * len(callers)))
        cats.append(("tick", 1.0))
        fw = (self.cfg.w_crash + self.cfg.w_partition + self.cfg.w_campaign) * 3 if faults else 0.0
        if fw:
            cats.append(("fault", fw))
        kind = rng.choices([k for k, _ in cats], [w for _, w in cats])[0]
        self.stats["ev_" + kind] += 1
        if kind == "deliver":
            self.deliver(rng.choice(due))
        elif kind == "write":
            rng.choice(writers).write_ready()
        elif kind == "sync":
            rng.choice(syncers).sync_ready()
        elif kind == "call":
            self.issue(rng.choice(callers))
        elif kind == "tick":
            for r in reps:
                if rng.random() < 0.9:
                    r.rn.tick()
        else:
            self.fault()

    def settled(self) -> bool:
        meta = max((r.machine.slot_map for r in self.replicas(META)), key=lambda m: m.epoch)
        if meta.migrations or self.moves_wanted > 0 or any(a.state != "done" for a in self.clients):
            return False
        for gid in self.frontier:
            reps = list(self.replicas(gid))
            if any(r.pending is not None or r.rn.has_ready() for r in reps):
                return False
            if len({r.machine.applied_index for r in reps}) != 1:
                return False
        return True

    def fail(self, reason: str) -> ShardSimFailure:
        return ShardSimFailure(self.seed, self.cfg, reason, list(self.trace))


def run(seed: int, cfg: ShardSimConfig) -> "ShardSim":
    """One whole run: the faulty phase, the healing phase, the final checks. ShardSimFailure on
    any violation, with the seed and a reproduction command."""
    sim = ShardSim(seed, cfg)
    try:
        for _ in range(cfg.steps):
            sim.step_once(faults=True)
        sim.workload_on = False
        sim.blocked.clear()
        for node in sim.nodes.values():
            if node.crashed:
                sim.restart(node)
        sim.trace_event("heal all; settling")
        settle = 0
        while not sim.settled():
            settle += 1
            if settle > SETTLE_MAX:
                raise AssertionError("did not settle in %d steps: moves left %d, map %r, clients %s" % (
                    SETTLE_MAX, sim.moves_wanted, max((r.machine.slot_map for r in sim.replicas(META)),
                                                      key=lambda m: m.epoch).migrations,
                    [a.state for a in sim.clients]))
            sim.step_once(faults=False)
        sim.stats["settle_steps"] = settle
        sim.checker.final()
    except ShardSimFailure:
        raise
    except Exception as exc:
        raise sim.fail("%s: %s" % (type(exc).__name__, exc)) from exc
    return sim
