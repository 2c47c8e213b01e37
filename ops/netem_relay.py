"""A userspace delay relay: netem's delay with jitter for a kernel without qdiscs.

ops/faults.py runs one inside a victim node's network namespace and points nft NAT
rules at it (see `nft_rules`):
- prerouting: TCP arriving for the node's gRPC and RESP ports (peers and clients);
- output: TCP the node opens to other nodes' gRPC port.
Both are redirected to RELAY_PORT; the relay learns where each connection was going
(SO_ORIGINAL_DST, kept by the NAT) and connects there itself. Its own connection to the
node's address is not redirected again: both rules leave the node's own loopback
traffic alone (a node talking to itself crosses no network), and the output rule lets
the relay's own connections (SO_MARK RELAY_MARK) by.

What it delays is what netem on the node's eth0 would: the bytes the NODE sends. On a
connection to the node that is the reply direction; on a connection the node opened,
the request direction. Each chunk read is held delay ± jitter (uniform) but never
released before the chunk read before it: TCP delivers in order, so the jitter changes
spacing, not order. Duplication and reordering cannot be shown to xraft through TCP
at all (the peer's kernel hides them), which is why ops/faults.py refuses them here.

    python -m xraft.ops.netem_relay --address A --delay-ms D --jitter-ms J [--seed N]

prints "listening <port>" once it accepts, then runs until SIGTERM/SIGKILL.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import random
import socket
import struct
import sys
import time

RELAY_PORT = 7999
RELAY_MARK = 0x7e1a           # SO_MARK of the relay's own connections: the output rule lets them by
SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h
CHUNK = 64 * 1024
MAX_QUEUED_CHUNKS = 256       # per direction: a slow reader back-pressures the writer (16 MiB at most)
MAX_CONNECTIONS = 512
MAX_DELAY_MS = 10_000
CONNECT_TIMEOUT_S = 5.0


def nft_rules(table: str, address: str, node_ports: tuple, peer_port: int) -> str:
    """The NAT rules (in `table inet <table>`, which heal deletes whole) sending the node's
    TCP through the relay. NAT only catches new connections, so the filter chains reset
    the ones open before (their packets still carry the real ports: new ones reach the
    filter hooks already redirected to RELAY_PORT); their ends reconnect, through the relay."""
    ports = ", ".join(str(p) for p in node_ports)
    inbound = f'iifname != "lo" ip daddr {address} tcp dport {{ {ports} }}'
    outbound = f"meta mark != {RELAY_MARK:#x} ip daddr != {{ {address}, 127.0.0.0/8 }} tcp dport {peer_port}"
    return (f"table inet {table} {{\n"
            f" chain delay_in {{ type nat hook prerouting priority -100; policy accept;\n"
            f"  {inbound} redirect to :{RELAY_PORT}\n }}\n"
            f" chain delay_out {{ type nat hook output priority -100; policy accept;\n"
            f"  {outbound} redirect to :{RELAY_PORT}\n }}\n"
            f" chain delay_reset_in {{ type filter hook input priority 0; policy accept;\n"
            f"  {inbound} reject with tcp reset\n }}\n"
            f" chain delay_reset_out {{ type filter hook output priority 0; policy accept;\n"
            f"  {outbound} reject with tcp reset\n }}\n"
            f"}}\n")


def original_dst(sock: socket.socket) -> tuple:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!H4s", raw, 2)
    return socket.inet_ntoa(packed), port


async def marked_connection(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, RELAY_MARK)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        return sock
    except BaseException:
        sock.close()
        raise


class Relay:
    def __init__(self, address: str, delay_ms: float, jitter_ms: float, rng: random.Random):
        if not 0 <= jitter_ms <= delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay {delay_ms} ms, jitter {jitter_ms} ms: expected 0 <= jitter <= delay <= "
                             f"{MAX_DELAY_MS}")
        self.address, self.delay_s, self.jitter_s, self.rng = address, delay_ms / 1000, jitter_ms / 1000, rng
        self.connections = 0

    def hold_s(self) -> float:
        return max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= MAX_CONNECTIONS:
            writer.close()
            return
        self.connections += 1
        up_writer = None
        try:
            host, port = original_dst(writer.get_extra_info("socket"))
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(sock=await marked_connection(host, port))
            inbound = host == self.address     # a connection TO the node: it sends the replies
            await asyncio.gather(self.pipe(reader, up_writer, delayed=not inbound),
                                 self.pipe(up_reader, writer, delayed=inbound))
        except (OSError, TimeoutError):
            pass                               # as a refused or reset connection would be
        finally:
            self.connections -= 1
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
        queue: asyncio.Queue = asyncio.Queue(MAX_QUEUED_CHUNKS)

        async def read() -> None:
            last_release = 0.0
            try:
                while True:
                    data = await reader.read(CHUNK)
                    # Released in order: never before the chunk read before this one.
                    last_release = max(last_release, time.monotonic() + (self.hold_s() if delayed else 0.0))
                    await queue.put((last_release, data))
                    if not data:
                        return
            except OSError:
                await queue.put((last_release, b""))

        reading = asyncio.ensure_future(read())
        try:
            while True:
                release, data = await queue.get()
                wait = release - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        finally:
            reading.cancel()


async def serve(relay: Relay) -> None:
    server = await asyncio.start_server(relay.handle, "0.0.0.0", RELAY_PORT, reuse_address=True)
    print(f"listening {RELAY_PORT}", flush=True)
    async with server:
        await server.serve_forever()     # until SIGTERM/SIGKILL: nothing to flush, no state to keep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="netem_relay", description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="the node's own address (connections to it are inbound)")
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    try:
        relay = Relay(a.address, a.delay_ms, a.jitter_ms, random.Random(a.seed))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    asyncio.run(serve(relay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
