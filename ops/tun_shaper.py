"""A userspace egress shaper: netem's delay ± jitter, loss, duplication and reordering on a
kernel without qdiscs (no sch_netem, no nft queue/dup), through a TUN device.

ops/faults.py runs one inside a victim node's network namespace:

    python -m xraft.ops.tun_shaper --address A --targets B,C,... [--delay-ms D --jitter-ms J
        --loss-pct L --duplicate-pct P --reorder-pct R --gap-ms G --seed N]

It opens TUN device TUN_NAME (in that namespace only), brings it up and adds one /32 route
per target (`ip route add T/32 dev TUN_NAME src A`), so what the node sends to those
addresses (its peers and the bridge its clients come through) is handed to this process
instead of eth0; loopback and everything else keep their routes. Each IPv4 packet read from
the TUN is checked (validate_packet), then lost, duplicated, delayed and reordered, and sent
on eth0 through a raw IPv4 socket (IPPROTO_RAW: the packet carries its own header) bound to
eth0 with SO_BINDTODEVICE: a lookup bound to eth0 skips the /32 routes through the TUN
(their device is another), so the packet leaves through eth0's connected route, and the
kernel resolves the peer's MAC (ARP) as for any packet. AF_PACKET would need the peer's MAC
itself (its own ARP), which a raw IP socket gets for free.

Same as tc netem, only egress is shaped: what arrives on eth0 does not pass the TUN.
Semantics (per packet, in this order):
- loss: dropped with probability loss-pct;
- duplication: with probability duplicate-pct a second copy is sent too (same release time);
- delay ± jitter: held delay ± jitter (uniform), but never released before the packet read
  before it (jitter changes spacing, not order: netem with a FIFO child);
- reordering: with probability reorder-pct a packet is held gap-ms MORE than its release,
  and the packets after it pass it (they keep the in-order rule among themselves).
Limits: MAX_QUEUED_PACKETS and MAX_QUEUED_BYTES held at once (beyond: dropped, as netem's
`limit` drops), delay + jitter and gap <= MAX_DELAY_MS.

The process owns the TUN device; nothing is persistent: when it dies (SIGTERM, SIGKILL, or
its namespace deleted by `hosts down`), the kernel removes the device and with it its
routes, and the node's traffic goes through eth0 again. It prints "ready <tun>" once the
routes are in place, and on SIGTERM its counters (stderr) before it exits.
"""
from __future__ import annotations

import argparse
import fcntl
import heapq
import ipaddress
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

TUN_NAME = "xrshape0"
DEVICE = "eth0"
TUNSETIFF = 0x400454CA        # linux/if_tun.h
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_DELAY_MS = 10_000
MAX_QUEUED_PACKETS = 10_000
MAX_QUEUED_BYTES = 32 * 1024 * 1024
MAX_TARGETS = 64
MAX_PACKET = 65_535
READS_PER_WAKEUP = 256        # a flood cannot starve the releases
IDLE_WAKEUP_S = 0.2           # how soon a SIGTERM is noticed (select is retried after a signal)


class BadPacket(ValueError):
    """A packet read from the TUN that is not a sane IPv4 packet to a target."""


@dataclass
class Shape:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    duplicate_pct: float = 0.0
    reorder_pct: float = 0.0
    gap_ms: float = 0.0

    def validate(self) -> "Shape":
        if not 0 <= self.jitter_ms <= self.delay_ms or self.delay_ms + self.jitter_ms > MAX_DELAY_MS:
            raise ValueError(f"delay {self.delay_ms} ms ± {self.jitter_ms} ms: expected 0 <= jitter <= delay "
                             f"and delay + jitter <= {MAX_DELAY_MS}")
        if not 0 <= self.gap_ms <= MAX_DELAY_MS:
            raise ValueError(f"gap {self.gap_ms} ms: expected 0 to {MAX_DELAY_MS}")
        for name in ("loss_pct", "duplicate_pct", "reorder_pct"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValueError(f"{name.replace('_pct', '')} {getattr(self, name)}%: expected 0 to 100")
        if self.reorder_pct and not self.gap_ms:
            raise ValueError("reordering needs a gap (--gap-ms > 0): a packet held 0 ms more is passed by nothing")
        return self


def validate_packet(packet: bytes, targets: frozenset) -> bytes:
    """The destination address (4 bytes) of an IPv4 packet whose header is sane and whose
    destination is one of the routed targets; BadPacket otherwise."""
    if len(packet) < 20:
        raise BadPacket(f"{len(packet)} bytes: shorter than an IPv4 header")
    version, ihl = packet[0] >> 4, (packet[0] & 0x0F) * 4
    if version != 4:
        raise BadPacket(f"IP version {version}")
    total = struct.unpack_from("!H", packet, 2)[0]
    if ihl < 20 or total < ihl or total != len(packet):
        raise BadPacket(f"header length {ihl}, total length {total}, read {len(packet)} bytes")
    dst = packet[16:20]
    if dst not in targets:
        raise BadPacket(f"destination {socket.inet_ntoa(dst)} is not a shaped target")
    return dst


@dataclass
class Queue:
    """Packets held until their release time: a heap of (release, seq, packet, dst)."""
    shape: Shape
    rng: random.Random
    heap: list = field(default_factory=list)
    bytes_held: int = 0
    seq: int = 0
    last_in_order: float = 0.0
    counts: dict = field(default_factory=lambda: dict.fromkeys(
        ("read", "bad", "lost", "duplicated", "reordered", "overflow", "sent", "send_errors"), 0))

    def offer(self, packet: bytes, dst: bytes, now: float) -> None:
        s, rng = self.shape, self.rng
        if s.loss_pct and rng.random() * 100 < s.loss_pct:
            self.counts["lost"] += 1
            return
        copies = 2 if s.duplicate_pct and rng.random() * 100 < s.duplicate_pct else 1
        hold_ms = max(0.0, s.delay_ms + rng.uniform(-s.jitter_ms, s.jitter_ms)) if s.delay_ms else 0.0
        release = now + hold_ms / 1000
        if s.reorder_pct and rng.random() * 100 < s.reorder_pct:
            release = max(release, self.last_in_order) + s.gap_ms / 1000   # later packets pass it
            self.counts["reordered"] += 1
        else:
            release = self.last_in_order = max(release, self.last_in_order)
        for _ in range(copies):
            if len(self.heap) >= MAX_QUEUED_PACKETS or self.bytes_held + len(packet) > MAX_QUEUED_BYTES:
                self.counts["overflow"] += 1
                return
            self.seq += 1
            heapq.heappush(self.heap, (release, self.seq, packet, dst))
            self.bytes_held += len(packet)
        self.counts["duplicated"] += copies - 1

    def due(self, now: float) -> list:
        out = []
        while self.heap and self.heap[0][0] <= now:
            _, _, packet, dst = heapq.heappop(self.heap)
            self.bytes_held -= len(packet)
            out.append((packet, dst))
        return out

    def next_release(self):
        return self.heap[0][0] if self.heap else None


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise OSError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")


def device_mtu(device: str) -> int:
    with open(f"/sys/class/net/{device}/mtu") as f:
        return int(f.read())


def raw_sender(device: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
    sock.setblocking(False)
    return sock


def run(address: str, targets: list, shape: Shape, rng: random.Random, device: str = DEVICE,
        tun_name: str = TUN_NAME) -> dict:
    """Shape until SIGTERM/SIGINT; returns the counters."""
    target_set = frozenset(socket.inet_aton(t) for t in targets)
    fd = open_tun(tun_name)
    sender = raw_sender(device)
    ip("link", "set", "dev", tun_name, "mtu", str(device_mtu(device)), "up")
    for t in targets:
        ip("route", "replace", f"{t}/32", "dev", tun_name, "src", address)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    queue = Queue(shape, rng)
    print(f"ready {tun_name}", flush=True)
    while not stopping:
        now = time.monotonic()
        nxt = queue.next_release()
        wait = IDLE_WAKEUP_S if nxt is None else min(IDLE_WAKEUP_S, max(0.0, nxt - now))
        try:
            readable, _, _ = select.select([fd], [], [], wait)
        except InterruptedError:
            continue
        now = time.monotonic()
        for _ in range(READS_PER_WAKEUP if readable else 0):
            try:
                packet = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                break
            queue.counts["read"] += 1
            try:
                dst = validate_packet(packet, target_set)
            except BadPacket:
                queue.counts["bad"] += 1
                continue
            queue.offer(packet, dst, now)
        for packet, dst in queue.due(time.monotonic()):
            try:
                sender.sendto(packet, (socket.inet_ntoa(dst), 0))
                queue.counts["sent"] += 1
            except OSError:        # a full socket buffer or an unreachable neighbour: a lost packet
                queue.counts["send_errors"] += 1
    return queue.counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tun_shaper", description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="the node's own address (the source of what it sends)")
    p.add_argument("--targets", required=True, help="comma-separated addresses whose traffic is shaped")
    p.add_argument("--device", default=DEVICE)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--loss-pct", type=float, default=0.0)
    p.add_argument("--duplicate-pct", type=float, default=0.0)
    p.add_argument("--reorder-pct", type=float, default=0.0)
    p.add_argument("--gap-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    try:
        shape = Shape(a.delay_ms, a.jitter_ms, a.loss_pct, a.duplicate_pct, a.reorder_pct, a.gap_ms).validate()
        targets = [str(ipaddress.IPv4Address(t)) for t in a.targets.split(",") if t]
        ipaddress.IPv4Address(a.address)
        if not 1 <= len(targets) <= MAX_TARGETS or a.address in targets:
            raise ValueError(f"{len(targets)} targets: expected 1 to {MAX_TARGETS}, not the node's own address")
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    counts = run(a.address, targets, shape, random.Random(a.seed), a.device)
    print("counters " + " ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
