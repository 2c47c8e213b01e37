"""`xraftctl nemesis run`: clients (ops/nemesis_workload.py) against a namespace cluster
(ops/netns_hosts.py) while a nemesis injects faults (ops/faults.py); then heal, drain,
read the final state from every replica, and check the history (ops/nemesis_check.py).

Files, in DIR/nemesis-<seed>/: history.jsonl (every op and the nemesis timeline, and
the final state as the last line), report.json (what --json prints, plus details),
latency.png (latency of each op over time and ok throughput, nemesis intervals shaded).
"""
from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path
from typing import Optional

from . import faults as fl
from . import local_cluster as lc
from . import nemesis_check as nc
from . import nemesis_member as nm
from . import nemesis_workload as wl
from . import netns_hosts as nh

KINDS = ("partition", "kill", "pause", "clock", "disk", "netem")
# Asked for by name only (not in the CI runs of every KIND): membership changes (ops/nemesis_member.py)
# on a cluster of MEMBER_GROUPS data groups with spare namespaces.
EXTRA_KINDS = ("member",)
MEMBER_GROUPS = 2
# The disk fault's power cut (unsynced WAL writes lost) hits a majority, or every node.
POWER_CUTS = ("majority", "all")
DEFAULT_KINDS = ("partition", "kill", "pause", "clock", "disk")
# Small snapshots: a kill often lands while a node writes one (the crash-during-snapshot fault).
NEMESIS_NODE_ARGS = ("--snapshot-entries=200", "--tick-ms=50")
SETTLE_TIMEOUT_S = 90.0
NETEM_DELAYS_MS = (30, 100, 250)
DRAIN_LIMIT = 10_000        # XREADGROUP batches in the final drain
FIRST_ROUND_GRACE_S = 120.0  # how long a run may go past --time to inject its first round


class Nemesis(threading.Thread):
    """Every `interval` seconds: one fault of a random enabled kind, held `hold` seconds, healed."""

    def __init__(self, faults: fl.Faults, history: wl.History, kinds: list, rng: random.Random,
                 stop: threading.Event, interval: float, hold: float, power_cut: str = "majority",
                 members: Optional[nm.Members] = None):
        super().__init__(name="nemesis", daemon=True)
        self.members = members
        self.power_cut = power_cut
        self.faults, self.history, self.kinds, self.rng = faults, history, kinds, rng
        self.stop_event, self.interval, self.hold = stop, interval, hold
        self.injected: dict = {}
        self.error: Optional[BaseException] = None
        self.slow_starts = 0     # heals whose restart timed out (see heal_or_kill_slow_start)
        self.skipped: dict = {}
        self._round: list = []

    def first_round_done(self) -> bool:
        return set(self.injected) | set(self.skipped) >= set(self.kinds) | set(self.skipped)

    def next_kind(self) -> str:
        """Kinds in rounds, each round a fresh shuffle: a short run still sees every kind."""
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        return self._round.pop()

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.interval):
                kind = self.next_kind()
                try:
                    detail = self.inject(kind)
                except fl.FaultUnsupported as e:
                    self.skipped[kind] = str(e)
                    self.kinds = [k for k in self.kinds if k != kind] or ["partition"]
                    self._round = [k for k in self._round if k != kind]
                    continue
                except lc.StartTimeout as e:     # the clock kind restarts a node as part of its fault
                    detail = self._kill_slow_start(e)
                self.history.event("nemesis", "start", {"kind": kind, "detail": detail})
                self.injected[kind] = self.injected.get(kind, 0) + 1
                time.sleep(self.hold)   # held in full, even when the run is ending
                self.history.event("nemesis", "stop", {"kind": kind, "detail": self.heal_or_kill_slow_start(kind)})
        except BaseException as e:
            self.error = e

    def heal_or_kill_slow_start(self, kind: str) -> str:
        """heal(kind), where a node that started but was not ready within the restart timeout
        (a saturated machine: a soak at load 33 took more than 60 s) is killed again rather than
        ending the nemesis: a kill during recovery is one more fault, the next heal restarts it,
        and the final heal (SETTLE_TIMEOUT_S) must bring it up or the run fails."""
        try:
            return self.heal(kind)
        except lc.StartTimeout as e:
            return self._kill_slow_start(e)
        except lc.LocalClusterError as e:   # e.g. the cluster lock not free in time: the final heal retries
            return f"heal incomplete: {str(e).splitlines()[0][:200]}"

    def _kill_slow_start(self, e: lc.StartTimeout) -> str:
        for node_id in e.waiting:
            self.faults.kill(node_id)
        self.slow_starts += 1
        return f"node(s) {e.waiting} not ready in time, killed again: {str(e).splitlines()[0][:200]}"

    def inject(self, kind: str) -> str:
        f, victim = self.faults, self.rng.choice(self.faults.ids)
        if kind == "partition":
            return self.rng.choice([f.partition_halves, f.partition_leader, f.partition_ring, f.partition_one_way])()
        if kind == "kill":
            return f.kill(f.leader() or victim if self.rng.random() < 0.5 else victim)
        if kind == "pause":
            return f.pause(f.leader() or victim if self.rng.random() < 0.5 else victim)
        if kind == "clock":
            choice = self.rng.random()
            if choice < 0.3:
                return f.strobe(victim, self.rng.uniform(0.2, 5.0), 0.5)
            skewed = f.skew(victim, self.rng.choice([-1, 1]) * self.rng.uniform(0.5, 60.0))
            if choice < 0.6:
                # A node anchors its time at start and bounds later jumps: a skew only bites
                # fully in a node that starts with it (and may then lead).
                return f"{skewed}; {f.kill(victim)}; {f.restart_dead()}"
            return skewed
        if kind == "disk":
            # A power cut: a majority (or all) lose what their WAL never fsynced, which a
            # quorum that acknowledged a write must not (--fsync always); and ENOSPC on one.
            ids = list(f.ids)
            self.rng.shuffle(ids)
            cut = ids if self.power_cut == "all" else ids[:len(ids) // 2 + 1]
            return f"{f.power_cut(cut)}; {f.fill_disk(ids[-1])}"
        if kind == "member":
            return self.members.inject()
        if kind == "netem":
            delay_ms = self.rng.choice(NETEM_DELAYS_MS)
            # tc netem, or the TUN shaper without sch_netem: all four on what the victim sends.
            return f.netem(victim, delay_ms=delay_ms, jitter_ms=delay_ms // 2, loss_pct=20, duplicate_pct=5,
                           reorder_pct=10)
        raise ValueError(f"unknown nemesis kind {kind!r}")

    def heal(self, kind: str) -> str:
        f = self.faults
        if kind in ("partition", "netem"):
            return f.heal_network()
        if kind == "kill":
            return f.restart_dead()
        if kind == "pause":
            return f.resume_all()
        if kind == "clock":
            return f.heal_clocks()
        if kind == "disk":
            return f.heal_disks() + "; " + f.restart_dead()
        if kind == "member":
            return self.members.heal()
        raise ValueError(kind)


def parse_kinds(text: str) -> list:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
    if bad or not kinds:
        raise nh.HostsError(f"--nemesis {text!r}: expected a comma-separated list of {', '.join(KINDS + EXTRA_KINDS)}")
    return kinds


def run(dir_: str, time_s: float, kinds: list, seed: int, nodes: int = 5, interval: float = 4.0,
        hold: float = 4.0, keep: bool = False, progress: lc.Progress = lambda _m: None,
        fsync: Optional[str] = None, power_cut: str = "majority", spares: int = nm.SPARES) -> dict:
    """One run; returns the report (see `report`). Brings a cluster up in dir_ when it
    holds none (with `fsync`, the nodes' --fsync; with the member kind, `spares` spare
    namespaces; and down again afterwards unless keep). Progress lines carry the seconds
    since the run began: the timeline of where its time went."""
    progress = timeline(progress)
    made = not nh.hosts_file(dir_).exists()
    if made:
        member = "member" in kinds
        nh.up(dir_, nodes=nodes, fsync=fsync, node_args=NEMESIS_NODE_ARGS, progress=progress,
              groups=MEMBER_GROUPS if member else 1, spares=spares if member else 0)
        progress("cluster up")
    out = Path(dir_) / f"nemesis-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _run(dir_, out, time_s, kinds, seed, interval, hold, progress, power_cut)
    finally:
        if made and not keep:
            nh.down(dir_, progress=progress)
            progress("cluster down")


def timeline(progress: lc.Progress) -> lc.Progress:
    """progress with each line stamped by the seconds since this call."""
    t0 = time.monotonic()
    return lambda msg: progress(f"[{time.monotonic() - t0:6.1f}s] {msg}")


def _run(dir_, out, time_s, kinds, seed, interval, hold, progress, power_cut) -> dict:
    rng = random.Random(seed)
    faults = fl.Faults(dir_, rng)
    faults.heal_all()
    cluster = lc.load(dir_)
    resp = [n.resp for n in cluster.nodes]
    grpc = [n.grpc for n in cluster.nodes]
    progress("faults healed (start)")
    _setup(resp, rng)
    progress("consumer group created")
    history = wl.History(str(out / "history.jsonl"))
    stop, nemesis_stop = threading.Event(), threading.Event()
    workers = wl.start_workers(history, stop, seed, resp, grpc)
    members = nm.Members(dir_, faults, rng, progress) if "member" in kinds else None
    nemesis = Nemesis(faults, history, list(kinds), rng, nemesis_stop, interval, hold, power_cut, members)
    progress(f"seed {seed}: {len(workers)} clients, nemesis {','.join(kinds)} for {time_s:g}s")
    nemesis.start()
    time.sleep(time_s)
    # A short run still injects every kind once: it goes on (bounded) until the first round is done.
    deadline = time.monotonic() + FIRST_ROUND_GRACE_S
    while not nemesis.first_round_done() and nemesis.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    nemesis_stop.set()
    nemesis.join()
    progress(f"nemesis stopped: {nemesis.injected}")
    history.event("nemesis", "start", {"kind": "heal", "detail": "final heal"})
    healed = faults.heal_all(SETTLE_TIMEOUT_S)
    history.event("nemesis", "stop", {"kind": "heal", "detail": "; ".join(healed)})
    progress("final heal: " + "; ".join(healed))
    # Clients see the healed cluster: ops after the heal show it recovered. Restarted nodes
    # are ready before a leader is elected (after a power cut of a majority, seconds later).
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while faults.leader() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    stop.set()
    for w in workers:
        getattr(w, "interrupt", lambda: None)()
    for w in workers:
        w.join(wl.OP_TIMEOUT_S * 4)
    progress("clients stopped")
    if members is not None:
        # The last change finishes (or runs again, resuming from the map) on the healed cluster,
        # once the clients stopped: a learner then catches up with a log that no longer grows
        # (under the clients, the short CI run's final node add took minutes on a loaded machine).
        history.event("nemesis", "start", {"kind": "member", "detail": "final membership change"})
        finished = "; ".join(members.finish())
        history.event("nemesis", "stop", {"kind": "member", "detail": finished})
        progress(f"final membership change: {finished}")
        cluster = lc.load(dir_)
        cluster.nodes = [n for n in cluster.nodes if n.id in faults.ids]   # removed nodes hold no state
    progress("healed; draining and reading the final state")
    final = final_state(cluster, history, rng)
    history.event("final", "final", final)
    history.close()
    progress("final state read; checking the history")
    problems = [f"{w.name}: {w.error!r}" for w in workers if w.error] + (
        [f"nemesis: {nemesis.error!r}"] if nemesis.error else [])
    rep = report(history.records, nemesis.injected, nemesis.skipped, problems)
    if nemesis.slow_starts:
        rep["notes"].append(f"nemesis: {nemesis.slow_starts} restart(s) not ready within the restart timeout; "
                            "those nodes were killed again and restarted by a later heal")
    (out / "report.json").write_text(json.dumps(rep, indent=2, default=str) + "\n")
    try:
        draw(history.records, str(out / "latency.png"))
        rep["png"] = str(out / "latency.png")
    except ImportError as e:
        rep["notes"].append(f"no picture: {e} (pip install matplotlib)")
    rep["history"] = str(out / "history.jsonl")
    return rep


def _setup(resp: list, rng: random.Random) -> None:
    """The group the readers use, created before any client runs (retried until a leader takes it)."""
    client = wl.Resp(resp, rng)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    try:
        while True:
            try:
                client.call("XGROUP", "CREATE", wl.STREAM, wl.GROUP, "0", "MKSTREAM")
                return
            except wl.Failed as e:
                if "BUSYGROUP" in str(e):
                    return
                if time.monotonic() > deadline:
                    raise nh.HostsError(f"cannot create the consumer group: {e}")
            except wl.Unknown:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
    finally:
        client.close()


def _until(fn, what: str, timeout: float = SETTLE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            return fn()
        except (wl.Failed, wl.Unknown, redis_errors()) as e:
            last = e
        time.sleep(0.2)
    raise nh.HostsError(f"{what}: no answer within {timeout:g}s ({last})")


def redis_moved():
    import redis
    return redis.exceptions.MovedError


def redis_errors():
    import redis
    return redis.RedisError


def final_state(cluster: lc.ClusterInfo, history: wl.History, rng: random.Random) -> dict:
    """Drain the group (recorded as ordinary XREADGROUPs of consumer `drainer`, which acks
    nothing: what it gets stays pending and is checked), then read the stream, the PEL and
    the lists from the leader, and every replica's state once all applied the same index."""
    resp = [n.resp for n in cluster.nodes]
    drainer = wl.RespWorker("drainer", history, threading.Event(), rng.randrange(1 << 30), 0, resp)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    group_gone = []     # NOGROUP: the group itself was lost (a power cut under --fsync never)

    def drain():
        try:
            return drainer.resp.call("XREADGROUP", "GROUP", wl.GROUP, "drainer", "COUNT", 100,
                                     "STREAMS", wl.STREAM, ">")
        except wl.Failed as e:
            if str(e).startswith("NOGROUP"):
                group_gone.append(str(e))
            raise

    def pel():
        try:
            rows = drainer.resp.call("XPENDING", wl.STREAM, wl.GROUP, "-", "+", 1_000_000)
            return [[p[0], p[1], p[3]] for p in rows]
        except wl.Failed as e:
            if str(e).startswith("NOGROUP"):
                return []       # no group, nothing pending: the checkers say what was lost
            raise
    try:
        for _ in range(DRAIN_LIMIT):
            outcome, got = drainer.record("xreadgroup", wl.STREAM, None, drain, convert=wl.entry_ids,
                                          consumer="drainer")
            if outcome == "ok" and not got or group_gone:
                break
            if outcome != "ok":
                if time.monotonic() > deadline:
                    raise nh.HostsError("final drain: the cluster does not answer after the heal")
                time.sleep(0.2)
        read = lambda *a: _until(lambda: drainer.resp.call(*a), " ".join(map(str, a)))  # noqa: E731
        final = {
            "streams": {wl.STREAM: [[e[0], e[1][1]] for e in read("XRANGE", wl.STREAM, "-", "+")]},
            "pel": {wl.STREAM: _until(pel, "XPENDING")},
            "lists": {k: read("LRANGE", k, 0, -1) for k in (wl.LIST, wl.LIST2)},
        }
    finally:
        drainer.close()
    final["replicas"] = replica_states(cluster)
    return final


def replica_states(cluster: lc.ClusterInfo) -> dict:
    """{node id: {"applied", "state" (sha256 of its READONLY reads)}}: retried until every
    node's state was read at one applied index of its own (unchanged across the reads) and
    all states agree, or SETTLE_TIMEOUT_S passed (then the last readings, for the checker)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    states = {}
    while time.monotonic() < deadline:
        read = {str(node.id): _replica_state(node) for node in cluster.nodes}
        # On a sharded cluster (the member kind) only the nodes of the workload's group hold
        # its keys; the others redirect (MOVED) and have no state to compare.
        states = {k: v for k, v in read.items() if not v.get("elsewhere")}
        if all(s["stable"] for s in states.values()) and len({s["state"] for s in states.values()}) == 1:
            break
        time.sleep(0.5)
    return {k: {"applied": v["applied"] if v["stable"] else None, "state": v["state"]} for k, v in states.items()}


def _replica_state(node: lc.NodeInfo) -> dict:
    r = lc.resp_client(node.resp, 5.0, decode_responses=True)
    r.response_callbacks.clear()     # raw replies (redis-py's XPENDING parser expects a summary)

    def applied() -> int:
        # A sharded node (the member kind's cluster) has a line per hosted group instead
        # (raft_group<G>:role=...,applied_index=N,...): their sum only has to stay unchanged
        # across the reads, as the one group's index does.
        lines = r.execute_command("INFO", "raft").splitlines()
        for line in lines:
            if line.startswith("raft_applied_index:"):
                return int(line.split(":", 1)[1])
        per_group = [int(kv.split("=", 1)[1]) for line in lines if line.startswith("raft_group") and ":" in line
                     for kv in line.split(":", 1)[1].split(",") if kv.startswith("applied_index=")]
        if not per_group and not any(line.startswith("raft_groups_hosted:") for line in lines):
            raise ValueError("INFO raft has no raft_applied_index nor per-group applied_index")
        return sum(per_group)      # 0: a sharded node hosting no data group (all moved away)

    def read(*args):
        # An error reply is part of the state too (a missing key on one replica only is a difference).
        try:
            return r.execute_command(*args)
        except redis_errors() as e:
            if isinstance(e, (OSError, ConnectionError)) or not str(e):
                raise
            return f"error: {e}"
    try:
        before = applied()
        r.execute_command("READONLY")
        try:
            r.execute_command("TYPE", wl.STREAM)
        except redis_moved():
            return {"applied": None, "stable": False, "state": None, "elsewhere": True}
        keys = [wl.STREAM, wl.LIST, wl.LIST2, *wl.REGISTERS]
        state = {k: [read("TYPE", k)] for k in keys}
        state[wl.STREAM] += [read("XRANGE", wl.STREAM, "-", "+"), read("XINFO", "GROUPS", wl.STREAM),
                             _without_idle(read("XPENDING", wl.STREAM, wl.GROUP, "-", "+", 1_000_000))]
        for k in (wl.LIST, wl.LIST2):
            state[k].append(read("LRANGE", k, 0, -1))
        for k in wl.REGISTERS:
            state[k].append(read("XRANGE", k, "-", "+"))
        after = applied()
        digest = hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()
        return {"applied": after, "stable": before == after, "state": digest}
    except Exception as e:       # a node that does not answer has no state: not-converged
        return {"applied": None, "stable": False, "state": f"unreadable: {e!r}"}
    finally:
        r.close()


def _without_idle(pel):
    """XPENDING's [id, consumer, idle ms, count] without the idle time: it is each node's
    own clock since the delivery, not replicated state."""
    return pel if isinstance(pel, str) else [[p[0], p[1], p[3]] for p in pel]


# -- the report ----------------------------------------------------------------------------

def report(records: list, injected: dict, skipped: dict, problems: list) -> dict:
    checked = nc.check(records)
    summ = nc.summary(records)
    windows = summ.pop("unavailable")
    anomalies = dict(checked["anomalies"])
    if problems:
        anomalies["workload-errors"] = len(problems)
    return {**summ, "anomalies": anomalies, "unavailable_s": round(sum(b - a for a, b in windows), 3),
            "unavailable_windows": [[round(a, 3), round(b, 3)] for a, b in windows],
            "faults": injected, "faults_unsupported": skipped, "details": checked["details"],
            "notes": checked["notes"] + problems}


def json_summary(rep: dict) -> dict:
    return {k: rep[k] for k in ("ops", "ok", "fail", "info", "anomalies", "unavailable_s")}


def table(rep: dict) -> str:
    lines = [f"operations {rep['ops']}: ok {rep['ok']}, fail {rep['fail']}, info {rep['info']}",
             "faults injected: " + (", ".join(f"{k} x{v}" for k, v in sorted(rep["faults"].items())) or "none")]
    for kind, why in rep.get("faults_unsupported", {}).items():
        lines.append(f"  not injected: {kind}: {why}")
    lines.append(f"{'CHECKER':24} ANOMALIES")
    for name, count in rep["anomalies"].items():
        lines.append(f"{name:24} {count}")
    lines.append(f"unavailable {rep['unavailable_s']:.1f}s in {len(rep['unavailable_windows'])} window(s): " +
                 ", ".join(f"{a:.1f}-{b:.1f}s" for a, b in rep["unavailable_windows"][:10]))
    for name, details in rep["details"].items():
        for d in details[:3]:
            lines.append(f"  {name}: {d['kind']} {json.dumps(d['detail'], default=str)[:200]}")
    lines += [f"  note: {n}" for n in rep["notes"][:10]]
    lines.append("VALID" if not any(rep["anomalies"].values()) else "ANOMALIES FOUND")
    return "\n".join(lines)


def draw(records: list, path: str) -> None:
    """Latency of every op over time (by outcome) and ok ops per second, nemesis shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = nc.pair(records)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    colors = {"ok": "tab:blue", "fail": "tab:red", "info": "tab:orange"}
    for type_, color in colors.items():
        pts = [(o.invoke, (o.extra.get("gave_up", o.complete) - o.invoke) * 1000) for o in ops if o.type == type_]
        if pts:
            ax1.scatter([p[0] for p in pts], [max(p[1], 0.01) for p in pts], s=2, c=color, label=type_)
    ax1.set_yscale("log")
    ax1.set_ylabel("latency (ms)")
    ax1.legend(loc="upper right", markerscale=4)
    end = max((o.invoke for o in ops), default=1.0)
    buckets = [0] * (int(end) + 1)
    for o in ops:
        if o.type == "ok":
            buckets[min(int(o.complete), len(buckets) - 1)] += 1
    ax2.plot(range(len(buckets)), buckets, color="tab:blue")
    ax2.set_ylabel("ok ops / s")
    ax2.set_xlabel("time (s)")
    shade = {"partition": "tab:red", "kill": "black", "pause": "tab:purple", "clock": "tab:green",
             "disk": "tab:brown", "netem": "tab:pink", "heal": "tab:gray"}
    starts = {}
    for r in records:
        if r.get("process") == "nemesis":
            kind = r["value"]["kind"]
            if r["f"] == "start":
                starts[kind] = r["time"]
            elif kind in starts:
                for ax in (ax1, ax2):
                    ax.axvspan(starts[kind], r["time"], color=shade.get(kind, "gray"), alpha=0.15)
                ax1.text(starts.pop(kind), ax1.get_ylim()[1], kind, fontsize=6, va="top")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
