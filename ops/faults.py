"""Faults for a namespace cluster (ops/netns_hosts.py): network, processes, clocks, disks.

Every fault is a method of `Faults(dir_)` that does one thing and returns a short
description for the nemesis timeline; each kind has its heal. Only the root
namespace's clients are never cut: the faults act inside the node namespaces.

- partitions: nft drop rules on each node's input from the nodes it must not hear
  (table `inet xraft_nemesis`); `heal_network` deletes the table in every namespace.
  Shapes: random halves, the leader isolated, a majority ring (each node hears
  itself and its two neighbours: a majority of 5, and no two nodes share their
  majority), one way (a node hears nobody while everyone hears it).
- netem: delay with jitter, loss, duplication, reordering of what the node SENDS, by tc
  netem on its eth0 where the kernel has sch_netem. Without it (this kernel has no qdiscs
  at all), by a userspace shaper in the node's namespace (ops/tun_shaper.py): /32 routes
  to every other cluster address (peers, spares, the bridge its clients come through) go
  into a TUN device it owns, and it re-emits each packet on eth0 lost, duplicated, held
  delay ± jitter, or held back a gap while later ones pass. Inbound is untouched, as with
  netem. heal_network stops the shaper (its pid is in DIR/netem-shaper-<netns>.pid, so a
  later heal or `hosts down` finds it after a crash of the harness too); its TUN device
  and routes die with it. No /dev/net/tun and no sch_netem: FaultUnsupported.
- processes: SIGKILL, SIGSTOP/SIGCONT, restart from disk.
- clocks: the node's wall clock offset through libfaketime's offset file (skew),
  and a strobe thread that flips it back and forth.
- disks: fill the node's own filesystem (ENOSPC) with a ballast file; free it to heal.
  Power cut: SIGKILL nodes after writing their power-cut marker, so their next start
  loses every WAL write they never fsynced (node/runtime/unsynced_loss.py, a TEST-ONLY
  layer the namespace harness arms in its nodes); restart_dead brings them back and
  removes the markers.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import shutil
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from . import local_cluster as lc
from . import tun_shaper as shaper
from . import netns_hosts as nh

NFT_TABLE = "xraft_nemesis"
BALLAST = ".nemesis-ballast"
MAX_SKEW_S = 3600.0
KILL_WAIT_S = 5.0
RESTART_TIMEOUT_S = 60.0   # a restarted node logs ready within this (a loaded CI machine included)
SHAPER_START_S = 15.0
SHAPER_STOP_S = 2.0
# netem's reorder sends the reordered packets at once and delays the rest; the shaper holds
# the reordered ones back instead, by the delay or at least this much.
MIN_REORDER_GAP_MS = 10


class FaultUnsupported(nh.HostsError):
    """This machine cannot inject the fault (a kernel module or tool is missing)."""


class Faults:
    def __init__(self, dir_: str, rng: Optional[random.Random] = None):
        self.dir = dir_
        self.hosts = nh.load_hosts(dir_)
        self.rng = rng or random.Random()
        self._strobe: Optional[threading.Thread] = None
        self._strobe_stop = threading.Event()
        self._shapers: dict = {}     # netns -> the shaper Popen this process started (reaped on stop)
        # How long restart_dead waits for a restarted node to log ready (its default).
        self.restart_timeout_s = RESTART_TIMEOUT_S

    # -- topology -------------------------------------------------------------------
    @property
    def ids(self) -> list:
        """The cluster's members: not a spare namespace nobody started yet, nor a node
        removed from the cluster (the member nemesis marks both in hosts.json)."""
        return [h["id"] for h in self.hosts["nodes"] if not h.get("spare") and not h.get("removed")]

    def _host(self, node_id: int) -> dict:
        for h in self.hosts["nodes"]:
            if h["id"] == node_id:
                return h
        raise nh.HostsError(f"no node {node_id}")

    def leader(self) -> Optional[int]:
        row = lc.leader_of(nh.status(self.dir, timeout=0.5))
        return row["id"] if row else None

    # -- partitions -------------------------------------------------------------------
    def partition(self, grudge: dict) -> str:
        """grudge: node id -> ids whose packets it drops. Replaces any earlier partition."""
        self.heal_network()
        for node_id, blocked in grudge.items():
            if not blocked:
                continue
            ns = self._host(node_id)["netns"]
            addrs = ", ".join(self._host(b)["address"] for b in sorted(blocked))
            nh.sh("nft", "-f", "-", netns=ns, input_=(
                f"table inet {NFT_TABLE} {{\n chain input {{ type filter hook input priority 0; policy accept;\n"
                f"  ip saddr {{ {addrs} }} drop\n }}\n}}\n"))
        return "; ".join(f"{n} drops {sorted(b)}" for n, b in sorted(grudge.items()) if b)

    def complete_grudge(self, components: list) -> dict:
        """Each node drops every node outside its own component."""
        return {n: {m for m in self.ids if not any(n in c and m in c for c in components)} for n in self.ids}

    def partition_halves(self) -> str:
        ids = self.ids[:]
        self.rng.shuffle(ids)
        half = len(ids) // 2
        return "halves " + self.partition(self.complete_grudge([set(ids[:half]), set(ids[half:])]))

    def partition_leader(self) -> str:
        leader = self.leader() or self.rng.choice(self.ids)
        return f"isolate leader {leader}: " + self.partition(
            self.complete_grudge([{leader}, set(self.ids) - {leader}]))

    def partition_ring(self) -> str:
        ids = self.ids[:]
        self.rng.shuffle(ids)
        n = len(ids)
        grudge = {ids[i]: set(ids) - {ids[i], ids[(i - 1) % n], ids[(i + 1) % n]} for i in range(n)}
        return "majority ring " + self.partition(grudge)

    def partition_one_way(self) -> str:
        victim = self.rng.choice(self.ids)
        return f"one-way: {victim} hears nobody: " + self.partition({victim: set(self.ids) - {victim}})

    def heal_network(self) -> str:
        for h in self.hosts["nodes"]:
            nh.sh("nft", "delete", "table", "inet", NFT_TABLE, netns=h["netns"], check=False)
            nh.sh("tc", "qdisc", "del", "dev", "eth0", "root", netns=h["netns"], check=False)
            self._stop_shaper(h["netns"])
        return "network healed"

    # -- netem ------------------------------------------------------------------------
    def netem_supported(self) -> bool:
        ns = self.hosts["nodes"][0]["netns"]
        ok = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
                             "delay", "0ms"], capture_output=True).returncode == 0
        nh.sh("tc", "qdisc", "del", "dev", "eth0", "root", netns=ns, check=False)
        return ok

    def netem(self, node_id: int, delay_ms: int = 0, jitter_ms: int = 0, loss_pct: float = 0,
              duplicate_pct: float = 0, reorder_pct: float = 0) -> str:
        """tc netem on the node's eth0; without sch_netem the TUN shaper (module doc)."""
        ns = self._host(node_id)["netns"]
        if not self.netem_supported():
            return self._shape(node_id, ns, shaper.Shape(
                delay_ms, jitter_ms, loss_pct, duplicate_pct, reorder_pct,
                max(delay_ms, MIN_REORDER_GAP_MS) if reorder_pct else 0).validate())
        args = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem"]
        if delay_ms:
            args += ["delay", f"{delay_ms}ms", f"{jitter_ms}ms"]
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        if duplicate_pct:
            args += ["duplicate", f"{duplicate_pct}%"]
        if reorder_pct:
            args += ["reorder", f"{reorder_pct}%"] + ([] if delay_ms else ["delay", "5ms"])
        nh.sh(*args, netns=ns)
        return f"netem on {node_id}: {' '.join(args[6:])}"

    def _shaper_pidfile(self, ns: str) -> Path:
        return Path(self.dir) / f"netem-shaper-{ns}.pid"

    def _shape(self, node_id: int, ns: str, shape: shaper.Shape) -> str:
        """Start the TUN shaper in the node's namespace; it routes the node's traffic to the
        other cluster addresses through itself once it prints "ready"."""
        if not os.path.exists("/dev/net/tun"):
            raise FaultUnsupported("netem faults need tc netem (sch_netem) or /dev/net/tun, and this machine has "
                                   "neither")
        self._stop_shaper(ns)
        address = self._host(node_id)["address"]
        targets = [h["address"] for h in self.hosts["nodes"] if h["address"] != address]
        targets.append(self.hosts["bridge_address"])
        log = open(Path(self.dir) / f"netem-shaper-{ns}.log", "ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "xraft.ops.tun_shaper", "--address", address,
             "--targets", ",".join(targets), "--delay-ms", str(shape.delay_ms), "--jitter-ms", str(shape.jitter_ms),
             "--loss-pct", str(shape.loss_pct), "--duplicate-pct", str(shape.duplicate_pct),
             "--reorder-pct", str(shape.reorder_pct), "--gap-ms", str(shape.gap_ms),
             "--seed", str(self.rng.randrange(1 << 30))],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        log.close()
        self._shapers[ns] = proc
        # `ip netns exec` execs in place: proc.pid is the shaper itself.
        self._shaper_pidfile(ns).write_text(f"{proc.pid}\n")
        ready, _, _ = select.select([proc.stdout], [], [], SHAPER_START_S)
        line = proc.stdout.readline() if ready else b""
        proc.stdout.close()
        if not line.startswith(b"ready"):
            self._stop_shaper(ns)
            raise nh.HostsError(f"the netem shaper in {ns} did not start within {SHAPER_START_S:g}s "
                                f"(see {self.dir}/netem-shaper-{ns}.log)")
        parts = [f"delay {shape.delay_ms:g}ms ±{shape.jitter_ms:g}ms" if shape.delay_ms else "",
                 f"loss {shape.loss_pct:g}%" if shape.loss_pct else "",
                 f"duplicate {shape.duplicate_pct:g}%" if shape.duplicate_pct else "",
                 f"reorder {shape.reorder_pct:g}% gap {shape.gap_ms:g}ms" if shape.reorder_pct else ""]
        return f"netem on {node_id}: {' '.join(p for p in parts if p) or 'nothing'} (TUN shaper; no sch_netem here)"

    def _stop_shaper(self, ns: str) -> None:
        proc = self._shapers.pop(ns, None)
        pidfile = self._shaper_pidfile(ns)
        with contextlib.suppress(FileNotFoundError, ValueError):
            stop_shaper_pid(int(pidfile.read_text()))
        if proc is not None:
            proc.kill()
            proc.wait(KILL_WAIT_S)
        pidfile.unlink(missing_ok=True)

    # -- processes --------------------------------------------------------------------
    def signal(self, node_id: int, sig: signal.Signals) -> str:
        cluster = lc.load(self.dir)
        node = cluster.node(node_id)
        if not lc.is_alive(cluster, node):
            return f"node {node_id} not running"
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, sig)
        deadline = time.monotonic() + KILL_WAIT_S
        while sig == signal.SIGKILL and lc.is_alive(cluster, node) and time.monotonic() < deadline:
            time.sleep(0.02)   # gone (and reaped) before anyone restarts it on its ports
        return f"{sig.name} node {node_id}"

    def kill(self, node_id: int) -> str:
        return self.signal(node_id, signal.SIGKILL)

    def pause(self, node_id: int) -> str:
        return self.signal(node_id, signal.SIGSTOP)

    def resume_all(self) -> str:
        for node_id in self.ids:
            self.signal(node_id, signal.SIGCONT)
        return "SIGCONT all"

    def restart_dead(self, timeout: Optional[float] = None) -> str:
        """Raises lc.StartTimeout (with the ids still starting) when they are not ready in time."""
        timeout = self.restart_timeout_s if timeout is None else timeout
        cluster = lc.load(self.dir)
        dead = [n.id for n in cluster.nodes if n.id in self.ids and not lc.is_alive(cluster, n)]
        if dead:
            nh.restart(self.dir, dead, timeout)
        for node_id in dead:     # their WALs were rolled back at open: the power cut is over
            nh.power_cut_marker(self.dir, node_id).unlink(missing_ok=True)
        return f"restarted {dead}" if dead else "all running"

    def power_cut(self, node_ids: list) -> str:
        """kill -9 each node as a power cut would stop it: what its WAL never fsynced is
        gone when it starts again (see the module doc)."""
        for node_id in node_ids:
            nh.power_cut_marker(self.dir, node_id).write_text("power cut\n")
            self.kill(node_id)
        return f"power cut (unsynced WAL writes lost) of {sorted(node_ids)}"

    # -- clocks -----------------------------------------------------------------------
    def _clock_file(self, node_id: int) -> Path:
        return Path(self.dir) / f"node-{node_id}" / "faketime"

    def skew(self, node_id: int, seconds: float) -> str:
        """Offset the node's wall clock by `seconds` (negative: backward), live."""
        if nh.faketime_lib() is None:
            raise FaultUnsupported("libfaketime is not installed (Debian package faketime)")
        if abs(seconds) > MAX_SKEW_S:
            raise ValueError(f"skew {seconds}s beyond ±{MAX_SKEW_S}s")
        path = self._clock_file(node_id)
        tmp = path.with_name("faketime.tmp")
        tmp.write_text(f"{seconds:+.3f}s\n")
        os.replace(tmp, path)    # libfaketime reads the whole file each call: never half of one
        return f"clock of {node_id} {seconds:+.3f}s"

    def strobe(self, node_id: int, delta_s: float, period_s: float) -> str:
        """Flip the node's clock between +delta and -delta every period until heal_clocks."""
        self.stop_strobe()
        self._strobe_stop.clear()

        def run():
            sign = 1
            while not self._strobe_stop.wait(period_s):
                self.skew(node_id, sign * delta_s)
                sign = -sign
        self._strobe = threading.Thread(target=run, name="clock-strobe", daemon=True)
        self._strobe.start()
        return f"strobe clock of {node_id} ±{delta_s}s every {period_s}s"

    def stop_strobe(self) -> None:
        if self._strobe is not None:
            self._strobe_stop.set()
            self._strobe.join()
            self._strobe = None

    def heal_clocks(self) -> str:
        self.stop_strobe()
        for node_id in self.ids:
            if self._clock_file(node_id).exists():
                self.skew(node_id, 0.0)
        return "clocks reset"

    # -- disks ------------------------------------------------------------------------
    def _mount(self, node_id: int) -> Path:
        return Path(self.dir) / f"node-{node_id}" / "mnt"

    def fill_disk(self, node_id: int) -> str:
        """Take all free space on the node's filesystem: its next write gets ENOSPC."""
        ballast = self._mount(node_id) / BALLAST
        free = shutil.disk_usage(self._mount(node_id)).free
        with open(ballast, "ab") as f:
            with contextlib.suppress(OSError):
                os.posix_fallocate(f.fileno(), 0, free)
        with contextlib.suppress(OSError), open(ballast.with_name(BALLAST + "2"), "ab") as f:
            for _ in range(64 * 1024):    # the last blocks fallocate left (rounding), at most 256 MiB
                f.write(b"\0" * 4096)
                f.flush()
        return f"disk of {node_id} full ({shutil.disk_usage(self._mount(node_id)).free} bytes free)"

    def heal_disks(self) -> str:
        for node_id in self.ids:
            for name in (BALLAST, BALLAST + "2"):
                with contextlib.suppress(FileNotFoundError):
                    (self._mount(node_id) / name).unlink()
        return "disks freed"

    # -- everything -------------------------------------------------------------------
    def heal_all(self, restart_timeout: Optional[float] = None) -> list:
        return [self.heal_network(), self.heal_clocks(), self.heal_disks(), self.resume_all(),
                self.restart_dead(restart_timeout)]


def stop_shaper_pid(pid: int) -> None:
    """Stop pid if it still is a netem shaper (a pid file may outlive its process, and the
    pid be reused by another): SIGTERM (it logs its counters), SIGKILL if it lingers, and
    wait until it has exited: its TUN device (a fixed name a new shaper takes) goes only
    when its last descriptor closes."""
    for sig, wait_s in ((signal.SIGTERM, SHAPER_STOP_S), (signal.SIGKILL, KILL_WAIT_S)):
        if not _is_shaper(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while _is_shaper(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


def _is_shaper(pid: int) -> bool:
    """True while pid runs the shaper (a zombie has closed its descriptors: no longer)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return b"xraft.ops.tun_shaper" in cmdline and state not in ("Z", "X")
