"""The seeded whole-cluster simulation: one RNG, discrete steps, one event per step.

`run(seed)` derives a configuration from the seed (swarm testing, as TigerBeetle's
VOPR does: each seed enables its own mix and intensity of faults), then at each
step picks one event at random among those possible:

  deliver   one in-flight message whose delay has passed (loss, duplication, partitions)
  write     a node takes its Ready and writes it (messages go out at once)
  sync      a node makes its written Ready durable, sends persisted_messages, applies
  tick      one node's logical clock
  client    an idle client issues put / append / get
  fault     crash / restart, pause / resume, partition (symmetric or one-way) / heal,
            campaign, membership change, leadership transfer

The checker runs inside every event. After `steps` steps everything is healed and
the cluster must settle: one leader, every member applied up to its commit. Then
every write a client saw succeed must be applied on every member, and the
history must be linearizable. Every failure is a SimFailure carrying the seed,
the configuration, a one-line reproduction command and the last events.
"""
from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field, replace
from typing import Optional

from xraft.node.raft.quorum import VoteResult
from xraft.node.raft.types import Message, MessageType as MT, StateRole, link_violation
from xraft.ops import linearizability

from .checker import SafetyChecker, SafetyViolation, log_term
from .network import NetConfig, Network
from .node import SimNode, bootstrap_storage, new_member_storage
from .workload import Workload

TRACE_LEN = 200
STALL_STEPS = 3000  # settle steps without any progress that count as a livelock
SETTLE_MAX = 40_000  # overall bound on the healing phase; a healthy cluster needs a few hundred


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    steps: int = 400
    election_tick: int = 10
    heartbeat_tick: int = 1
    net: NetConfig = field(default_factory=NetConfig)
    clients: int = 3
    request_timeout: int = 120
    log_bound: int = 16  # entries kept before a snapshot + compaction
    snapshot_chunk_bytes: int = 1 << 20
    snapshot_window_chunks: int = 0  # chunks in flight per follower (raft/snapshot_send.py); 0 = 8 MiB
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    max_nodes: int = 8
    # event weights (0 disables the event)
    w_crash: float = 0.0
    w_pause: float = 0.0
    w_partition: float = 0.0
    w_campaign: float = 0.0
    w_admin: float = 0.0
    w_client: float = 3.0
    inject: frozenset = frozenset()  # checker self-tests only: deliberate harness bugs
    # Idle groups quiesce (node/raft/quiesce.py); the simulation then plays the runtime's
    # node-liveness watch (watch_quiesced_leaders) after every tick.
    quiesce: bool = False

    def describe(self) -> str:
        n = self.net
        return (f"nodes={self.nodes} steps={self.steps} delay<={n.max_delay} drop={n.drop_rate} "
                f"dup={n.dup_rate} crash={self.w_crash} pause={self.w_pause} partition={self.w_partition} "
                f"campaign={self.w_campaign} admin={self.w_admin} log_bound={self.log_bound} "
                f"chunk={self.snapshot_chunk_bytes} window={self.snapshot_window_chunks} msg_bytes={self.max_size_per_msg} "
                f"inflight={self.max_inflight_msgs} clients={self.clients} timeout={self.request_timeout}"
                + (f" inject={sorted(self.inject)}" if self.inject else "")
                + (" quiesce" if self.quiesce else ""))


def config_for_seed(seed: int, steps: int = 400, **overrides) -> SimConfig:
    """Swarm testing: the seed picks the cluster size and which faults, how often."""
    r = random.Random(seed ^ 0x5EED)
    on = lambda p, hi: r.choice((0.0, hi * 0.3, hi)) if r.random() < p else 0.0  # noqa: E731
    cfg = SimConfig(
        nodes=r.choice((3, 3, 5)),
        steps=steps,
        net=NetConfig(max_delay=r.randint(0, 6), drop_rate=r.choice((0.0, 0.0, 0.02, 0.1, 0.25)),
                      dup_rate=r.choice((0.0, 0.0, 0.02, 0.1))),
        clients=r.randint(1, 5),
        request_timeout=r.randint(60, 200),
        log_bound=r.choice((4, 8, 16, 64)),
        snapshot_chunk_bytes=r.choice((32, 128, 1 << 20)),
        max_size_per_msg=r.choice((1, 64, 1 << 20)),
        max_inflight_msgs=r.choice((1, 4, 256)),
        w_crash=on(0.5, 0.02),
        w_pause=on(0.4, 0.02),
        w_partition=on(0.5, 0.02),
        w_campaign=on(0.3, 0.01),
        w_admin=on(0.5, 0.02),
        # Its own stream, so the draws above (and every older seed's run) stay as they were.
        snapshot_window_chunks=random.Random(seed ^ 0x5A1D).choice((0, 1, 2, 4)),
    )
    return replace(cfg, **overrides)


def client_heavy_config(seed: int, steps: int) -> SimConfig:
    """The linearizability runs' configuration: the seed's faults, five busy clients."""
    return replace(config_for_seed(seed, steps=steps), clients=5, w_client=6.0, request_timeout=150)


def repro_command(seed: int, steps: int, test_file: str = "tests/raft/test_sim_safety.py") -> str:
    return f"XRAFT_SIM_SEED={seed} XRAFT_SIM_STEPS={steps} python -m pytest {test_file} -q"


class SimFailure(AssertionError):
    def __init__(self, seed: int, cfg: SimConfig, reason: str, trace: list[str], repro: str):
        self.seed, self.cfg, self.reason, self.trace = seed, cfg, reason, trace
        lines = [f"simulation failed: {reason}", f"seed={seed} config: {cfg.describe()}",
                 f"reproduce: {repro}", f"last {len(trace)} events:"] + trace
        super().__init__("\n".join(lines))


@dataclass
class Result:
    seed: int
    cfg: SimConfig
    steps: int
    settle_steps: int
    history: list
    counts: dict
    net: tuple
    linearizable: Optional[bool]  # None when the checker ran out of budget
    trace_digest: int
    quiesced_ticks: int = 0  # ticks at which some node was quiesced (SimConfig.quiesce)


class Simulation:
    def __init__(self, seed: int, cfg: SimConfig) -> None:
        self.seed = seed
        self.cfg = cfg
        self.rng = random.Random(seed)  # THE source of randomness: scheduler, network, nodes, clients
        self.now = 0
        self.trace: collections.deque = collections.deque(maxlen=TRACE_LEN)
        self.trace_hash = 0  # digest of every event, for the determinism test
        self.checker = SafetyChecker()
        self.net = Network(self.rng, cfg.net)
        self.workload = Workload(self)
        self.nodes: dict[int, SimNode] = {}
        self.next_id = cfg.nodes + 1
        self.lossy = True
        self.pending_lost: list[tuple[int, Message]] = []  # overflowed (via, msg), reported after the event
        self.quiesced_ticks = 0
        self.relayed = 0  # delivered messages whose link sender is not their frm (forwarded twice)
        voters = tuple(range(1, cfg.nodes + 1))
        for nid in voters:
            self.nodes[nid] = SimNode(self, nid, bootstrap_storage(voters))

    # ------------------------------------------------ helpers

    def trace_event(self, *parts) -> None:
        self.trace.append((self.now, parts))
        self.trace_hash = hash((self.trace_hash, self.now, repr(parts))) & 0xFFFFFFFFFFFF

    def send(self, m: Message, via: int) -> None:
        self.net.send(self.now, m, via)
        if self.net.overflowed:
            lost, self.net.overflowed = self.net.overflowed, []
            self.pending_lost.extend(lost)

    def report_lost(self, lost: list[tuple[int, Message]]) -> None:
        """Like a real transport, tell a sender that its snapshot stream broke (else it waits forever)."""
        for via, m in lost:
            src = self.nodes.get(via)
            if m.type == MT.SNAP and src is not None:
                src.report_snapshot(m.to, False)

    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.is_up()]

    def current_leader(self) -> Optional[SimNode]:
        leads = [n for n in self.up_nodes() if n.role() == StateRole.LEADER]
        return max(leads, key=lambda n: n.rn.raft.term) if leads else None

    def add_node(self) -> int:
        nid = self.next_id
        self.next_id += 1
        self.nodes[nid] = SimNode(self, nid, new_member_storage())
        self.trace_event("new-node", nid)
        return nid

    # ------------------------------------------------ events

    def deliver(self, positions: list[int]) -> None:
        m, via, fate = self.net.take(self.rng.choice(positions), self.now, lossy=self.lossy)
        dst = self.nodes.get(m.to)
        src = self.nodes.get(via)  # the link's sender (a forwarded request keeps its originator in frm)
        if fate == "deliver" and (dst is None or dst.crashed):
            fate = "nobody"
        self.trace_event(fate, m, *(() if via == m.frm else (f"via {via}",)))
        if fate != "deliver":
            if src is not None and fate == "blocked":
                src.report_unreachable(m.to)
            if m.type == MT.SNAP and src is not None:
                src.report_snapshot(m.to, False)
            return
        # The transports' acceptance rule (GrpcTransport ends the link's whole stream on a
        # violation): a core that breaks it must fail here, not only in a real cluster.
        why = link_violation(m, via, m.to)
        if why is not None:
            raise SafetyViolation(f"transport: the receiver would end the stream of node {via}: {why}")
        if via != m.frm:
            self.relayed += 1
        dst.step(m)
        if m.type == MT.SNAP and m.chunk_offset + len(m.snapshot.data) == m.chunk_total:
            if src is not None:
                src.report_snapshot(m.to, True)

    def fault(self) -> None:
        c, rng = self.cfg, self.rng
        kinds = [(k, w) for k, w in (("crash", c.w_crash), ("pause", c.w_pause), ("partition", c.w_partition),
                                      ("campaign", c.w_campaign), ("admin", c.w_admin)) if w > 0]
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        nodes = sorted(self.nodes)
        if kind == "crash":
            down = [n for n in nodes if self.nodes[n].crashed]
            if down and rng.random() < 0.6:
                self.restart(self.nodes[rng.choice(down)])
            else:
                # Half the crashes hit a node between writing a Ready and syncing it: the moment
                # where a harness or core that promises too early loses acknowledged state.
                torn = [n for n in nodes if self.nodes[n].pending is not None]
                node = self.nodes[rng.choice(torn if torn and rng.random() < 0.5 else nodes)]
                if not node.crashed:
                    self.trace_event("crash", node.id, f"unsynced={node.storage.unsynced_writes()}")
                    node.crash()
        elif kind == "pause":
            paused = [n for n in nodes if self.nodes[n].paused]
            if paused and rng.random() < 0.6:
                nid = rng.choice(paused)
                self.nodes[nid].resume()
                self.trace_event("resume", nid)
            else:
                nid = rng.choice(nodes)
                self.nodes[nid].paused = True
                self.trace_event("pause", nid)
        elif kind == "partition":
            if self.net.blocked and rng.random() < 0.5:
                self.net.heal()
                self.trace_event("heal")
            else:
                group = set(rng.sample(nodes, rng.randint(1, max(1, len(nodes) // 2))))
                one_way = rng.random() < 0.3
                self.net.partition(group, set(nodes) - group, one_way)
                self.trace_event("partition", sorted(group), "one-way" if one_way else "both-ways")
        elif kind == "campaign":
            node = self.nodes[rng.choice(nodes)]
            if node.is_up():
                self.trace_event("campaign", node.id)
                node.call(node.rn.campaign)
        else:
            self.workload.admin_action()

    def restart(self, node: SimNode) -> None:
        node.start()
        self.trace_event("restart", node.id, f"snap={node.storage.snapshot().metadata.index}",
                         f"hs={node.storage.hard_state()}", f"last={node.storage.last_index()}")

    def step_once(self, faults: bool) -> None:
        self.now += 1
        rng = self.rng
        ups = self.up_nodes()
        writers = [n for n in ups if n.pending is None and n.rn.has_ready()]
        syncers = [n for n in ups if n.pending is not None]
        deliverable = self.net.deliverable(self.now, {n.id for n in self.nodes.values() if n.paused})
        idle = self.workload.idle_clients() if faults else []
        cats = []
        # Work queues get weight in proportion to their length, so the network and the disks
        # drain faster than ticks fill them (a fixed weight lets heartbeats pile up forever).
        if deliverable:
            cats.append(("deliver", 2.0 + len(deliverable)))
        if writers:
            cats.append(("write", 2.0 * len(writers)))
        if syncers:
            cats.append(("sync", 2.0 * len(syncers)))
        if ups:
            cats.append(("tick", 1.5))
        if idle and self.cfg.w_client > 0:
            cats.append(("client", self.cfg.w_client))
        fw = (self.cfg.w_crash + self.cfg.w_pause + self.cfg.w_partition + self.cfg.w_campaign
              + self.cfg.w_admin) * 20 if faults else 0.0
        if fw > 0:
            cats.append(("fault", fw))
        if not cats:
            return
        kind = rng.choices([k for k, _ in cats], [w for _, w in cats])[0]
        if kind == "deliver":
            self.deliver(deliverable)
        elif kind == "write":
            node = rng.choice(writers)
            self.trace_event("write", node.id)
            node.write_ready()
        elif kind == "sync":
            node = rng.choice(syncers)
            self.trace_event("sync", node.id, f"commit={node.pending.hard_state}",
                             f"apply={[e.index for e in node.pending.committed_entries][-3:]}")
            node.sync_ready()
        elif kind == "tick":
            # One clock tick for the cluster; each node may miss it (clock skew between nodes).
            for node in ups:
                if rng.random() < 0.9:
                    node.tick()
            if self.cfg.quiesce:
                self.watch_quiesced_leaders(ups)
        elif kind == "client":
            self.workload.client_action(rng.choice(idle))
        else:
            self.fault()
        self.workload.expire(self.now)
        if self.pending_lost:
            lost, self.pending_lost = self.pending_lost, []
            self.report_lost(lost)

    def watch_quiesced_leaders(self, ups: list[SimNode]) -> None:
        """What node/runtime/liveness.py does, with a perfect (and so eager) failure detector.
        A quiesced follower: its leader's node is down, paused or cut off from it -> wake with
        the lease expired; the leader's node is up but no longer leads at our term -> wake.
        A quiesced leader: a quorum of its voters' nodes is down or cut off -> wake with the
        lease expired. Eager wakes are the harsher test: they start elections sooner."""
        if any(n.rn.raft.quiesced for n in ups):
            self.quiesced_ticks += 1
        for node in ups:
            r = node.rn.raft
            if not r.quiesced:
                continue
            if r.state == StateRole.LEADER:
                # A quorum of its voters' nodes down or cut off from it: wake, lease expired.
                voters = r.trk.config.voters
                alive = {v: v == node.id or (v in self.nodes and self.nodes[v].is_up()
                                             and (v, node.id) not in self.net.blocked) for v in voters.ids()}
                if voters.vote_result(alive) != VoteResult.WON:
                    self.trace_event("wake", node.id, "leader", "quorum silent")
                    node.call(node.rn.wake, True)
                continue
            lead = self.nodes.get(r.lead)
            if lead is None or not lead.is_up() or (lead.id, node.id) in self.net.blocked:
                self.trace_event("wake", node.id, f"lead={r.lead}", "silent")
                node.call(node.rn.wake, True)
            elif lead.rn.raft.state != StateRole.LEADER or lead.rn.raft.term != r.term:
                self.trace_event("wake", node.id, f"lead={r.lead}", "not leading")
                node.call(node.rn.wake, False)

    # ------------------------------------------------ phases

    def heal_all(self) -> None:
        self.net.heal()
        self.lossy = False
        for node in self.nodes.values():
            node.resume()
            if node.crashed:
                self.restart(node)
        self.trace_event("heal-all")

    def members(self) -> list[SimNode]:
        lead = self.current_leader()
        cs = lead.conf_state if lead is not None else None
        ids = set(cs.voters) | set(cs.learners) | set(cs.voters_outgoing) if cs else set()
        return [self.nodes[i] for i in sorted(ids) if i in self.nodes]

    def settled(self) -> bool:
        lead = self.current_leader()
        if lead is None:
            return False
        log = lead.rn.raft.raft_log
        if log_term(lead, log.committed) != lead.rn.raft.term or lead.kv.applied_index != log.committed:
            return False
        if any(n.pending is not None for n in self.nodes.values()):
            return False
        return all(n.kv.applied_index == log.committed for n in self.members())

    def progress_marker(self) -> tuple:
        """What moves while a cluster converges: terms, commit and applied indexes, log lengths."""
        return tuple((n.id, n.rn.raft.term, n.rn.raft.raft_log.committed, n.kv.applied_index,
                      n.rn.raft.raft_log.last_index()) for n in self.nodes.values() if n.rn is not None)

    def final_checks(self) -> Optional[bool]:
        for node in self.members():
            missing = [r for r in self.workload.committed_rids if r not in node.kv.applied_ids]
            if missing:
                raise SafetyViolation(f"durability: node {node.id} lacks acknowledged writes {missing[:5]}")
        self.workload.finish()
        try:
            ok, bad = linearizability.check(self.workload.history, max_steps=300_000)
        except linearizability.CheckBudgetExceeded:
            return None
        if not ok:
            ops = "\n  ".join(map(repr, sorted(bad, key=lambda o: o.call)))
            raise SafetyViolation(f"history not linearizable; offending key's ops:\n  {ops}")
        return True

    def run(self) -> Result:
        for _ in range(self.cfg.steps):
            self.step_once(faults=True)
        self.heal_all()
        settle, stalled, marker = 0, 0, None
        while True:
            settle += 1
            self.step_once(faults=False)
            if settle % 10:
                continue
            if self.settled():
                break
            # Liveness means progress, not speed: fail when nothing advanced for a whole window
            # (a livelock), or when even a slow cluster blew the overall bound.
            now_marker = self.progress_marker()
            stalled = stalled + 10 if now_marker == marker else 0
            marker = now_marker
            if stalled >= STALL_STEPS or settle >= SETTLE_MAX:
                raise SafetyViolation(f"liveness: the healed cluster made no progress for {stalled} steps "
                                      f"({settle} settle steps): " + self.describe_nodes())
        lin = self.final_checks()
        n = self.net
        return Result(self.seed, self.cfg, self.cfg.steps, settle, self.workload.history,
                      dict(self.workload.counts), (n.sent, n.delivered, n.dropped, n.duplicated), lin,
                      self.trace_hash, self.quiesced_ticks)

    def describe_nodes(self) -> str:
        out = []
        for n in self.nodes.values():
            if n.rn is None:
                out.append(f"{n.id}:crashed")
                continue
            r = n.rn.raft
            out.append(f"{n.id}:{r.state.name} term={r.term} lead={r.lead} commit={r.raft_log.committed} "
                       f"applied={n.kv.applied_index} last={r.raft_log.last_index()} conf={n.conf_state}")
        return "; ".join(out)

    def formatted_trace(self) -> list[str]:
        return [f"{t:6d} " + " ".join(_fmt(p) for p in parts) for t, parts in self.trace]


def _fmt(p) -> str:
    if isinstance(p, Message):
        extra = f" ents={[(e.index, e.term) for e in p.entries]}" if p.entries else ""
        snap = f" snap=({p.snapshot.metadata.index},{p.snapshot.metadata.term}) off={p.chunk_offset}/" \
               f"{p.chunk_total}" if p.snapshot is not None else ""
        return (f"{p.type.name} {p.frm}->{p.to} t{p.term} lt{p.log_term} i{p.index} c{p.commit}"
                f"{' REJ' if p.reject else ''}{extra}{snap}")
    return str(p)


def run(seed: int, cfg: Optional[SimConfig] = None, test_file: str = "tests/raft/test_sim_safety.py") -> Result:
    """Run one seed; raise SimFailure (seed, config, repro command, trace) on any violation."""
    cfg = cfg or config_for_seed(seed)
    sim = Simulation(seed, cfg)
    try:
        return sim.run()
    except Exception as e:  # a checker violation, a core invariant, or a core crash: all are bugs
        reason = f"{type(e).__name__}: {e}"
        raise SimFailure(seed, cfg, reason, sim.formatted_trace() + ["nodes: " + _safe_nodes(sim)],
                         repro_command(seed, cfg.steps, test_file)) from e


def soak_failures(seeds: range, make_cfg, test_file: str) -> list[str]:
    """Run every seed (config make_cfg(seed)); one line + reproduction command per failing seed."""
    failures = []
    for seed in seeds:
        cfg = make_cfg(seed)
        try:
            run(seed, cfg, test_file=test_file)
        except SimFailure as e:
            failures.append(f"seed {seed}: {e.reason.splitlines()[0][:200]}\n  reproduce: "
                            + repro_command(seed, cfg.steps, test_file))
    return failures


def _safe_nodes(sim: Simulation) -> str:
    try:
        return sim.describe_nodes()
    except Exception as e:  # the state may be what broke
        return f"<unavailable: {e}>"


