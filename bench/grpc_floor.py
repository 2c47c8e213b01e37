"""The raw Python gRPC floor on this machine: what grpc.aio itself costs, before xraft does anything.

    python bench/grpc_floor.py [--quick] [--json FILE] [--seconds S] [--size BYTES]

A grpc.aio echo server (uvloop, its own process, as a node would be) and a
grpc.aio client (uvloop, this process) on 127.0.0.1, one channel (one HTTP/2
connection), payloads of --size bytes (default 64) passed as raw bytes (no
protobuf: the floor of the transport alone). Each phase runs --seconds (default
5; --quick: 1) after a short warm-up:

* unary calls/s with 1 call in flight, and p50 / p99 latency of those calls;
* unary calls/s with 64 calls in flight (64 coroutines looping on one channel);
* messages/s over one bidi stream: the client writes while a reader takes the
  echoes, at most 1024 messages unanswered (so the client never buffers without
  bound); counted as echoes received.

xraft's own figures (client RPCs/s through a node, Raft messages/s between
nodes) cannot beat these; they say how much of a later figure is gRPC's.

--json FILE writes grpc_floor_unary_c1_per_s, grpc_floor_unary_c64_per_s,
grpc_floor_p50_ms, grpc_floor_p99_ms, grpc_floor_stream_msgs_per_s, and the same
rates per CPU-second of client + server (*_per_cpu_s): the machine is shared, and
those hold up when other work slows the wall clock.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import grpc
import uvloop

SERVICE = "xraft.bench.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
CONCURRENCY = 64
STREAM_WINDOW = 1024  # echoes the stream client may wait for at once
WARMUP_S = 0.5
START_TIMEOUT_S = 30  # for the server process to report its port
CALL_TIMEOUT_S = 30  # per RPC: a stuck server fails the run rather than hanging it
MAX_SIZE = 1 << 20


# ------------------------------------------------------------------ server process


async def _serve() -> None:
    async def unary(request: bytes, context) -> bytes:
        return request

    async def stream(request_iterator, context):
        async for message in request_iterator:
            yield message

    server = grpc.aio.server()
    # No (de)serializers: the handlers see the raw bytes.
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")  # the OS picks a free port
    await server.start()
    print(port, flush=True)
    # Serve until the parent closes our stdin (or dies): no orphan server.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    await server.stop(grace=None)


# ------------------------------------------------------------------ client phases


async def _unary_loop(call, payload: bytes, until: float, latencies: list | None) -> int:
    n = 0
    clock = time.perf_counter
    while clock() < until:
        t0 = clock()
        reply = await call(payload, timeout=CALL_TIMEOUT_S)
        if latencies is not None:
            latencies.append(clock() - t0)
        if len(reply) != len(payload):
            raise RuntimeError("echo came back altered")
        n += 1
    return n


async def _unary(channel, cpu, payload: bytes, seconds: float, concurrency: int) -> tuple[float, float, list]:
    """(calls/s, calls per CPU-second, latencies in s when concurrency == 1)."""
    call = channel.unary_unary(UNARY)
    await asyncio.gather(*(_unary_loop(call, payload, time.perf_counter() + WARMUP_S, None)
                           for _ in range(concurrency)))
    latencies: list = [] if concurrency == 1 else None
    cpu0, t0 = cpu(), time.perf_counter()
    counts = await asyncio.gather(*(_unary_loop(call, payload, t0 + seconds, latencies)
                                    for _ in range(concurrency)))
    n, wall, used = sum(counts), time.perf_counter() - t0, cpu() - cpu0
    return n / wall, n / used, latencies or []


async def _stream(channel, cpu, payload: bytes, seconds: float) -> tuple[float, float]:
    """(echoed messages/s, per CPU-second) over one bidi stream."""
    call = channel.stream_stream(STREAM)(timeout=seconds + WARMUP_S + CALL_TIMEOUT_S)
    window = asyncio.Semaphore(STREAM_WINDOW)
    stop = asyncio.Event()
    sent = 0

    async def writer():
        nonlocal sent
        while not stop.is_set():
            await window.acquire()
            await call.write(payload)
            sent += 1
        await call.done_writing()

    received, rate, cpu0 = 0, None, 0.0
    w = asyncio.create_task(writer())
    try:
        t_start = time.perf_counter()
        warm_until, t0, counted_from = t_start + WARMUP_S, None, 0
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                break
            received += 1
            window.release()
            now = time.perf_counter()
            if t0 is None and now >= warm_until:
                t0, counted_from, cpu0 = now, received, cpu()
            if t0 is not None and now - t0 >= seconds and not stop.is_set():
                rate = (received - counted_from) / (now - t0)
                per_cpu = (received - counted_from) / (cpu() - cpu0)
                stop.set()
                window.release()  # a writer blocked on a full window must see `stop`
        await w
    finally:
        if not w.done():
            w.cancel()
    if rate is None:
        raise RuntimeError(f"stream ended after {received} echoes, before the measurement did")
    if received != sent:
        raise RuntimeError(f"stream lost messages: sent {sent}, echoed {received}")
    return rate, per_cpu


def _cpu_seconds(server_pid: int) -> float:
    """CPU time used so far by this process and the server process (Linux /proc).

    The machine is shared: wall-clock rates fall when others are busy, while
    calls per CPU-second say what gRPC itself costs."""
    with open(f"/proc/{server_pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return time.process_time() + server


def _pct(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _client(port: int, server_pid: int, seconds: float, size: int) -> dict:
    payload = os.urandom(size)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)
        cpu = functools.partial(_cpu_seconds, server_pid)
        c1, c1_cpu, latencies = await _unary(channel, cpu, payload, seconds, 1)
        c64, c64_cpu, _ = await _unary(channel, cpu, payload, seconds, CONCURRENCY)
        stream, stream_cpu = await _stream(channel, cpu, payload, seconds)
    return {
        "grpc_floor_unary_c1_per_s": round(c1, 1),
        "grpc_floor_unary_c64_per_s": round(c64, 1),
        "grpc_floor_p50_ms": round(statistics.median(latencies) * 1e3, 4),
        "grpc_floor_p99_ms": round(_pct(latencies, 0.99) * 1e3, 4),
        "grpc_floor_stream_msgs_per_s": round(stream, 1),
        "grpc_floor_unary_c1_per_cpu_s": round(c1_cpu, 1),
        "grpc_floor_unary_c64_per_cpu_s": round(c64_cpu, 1),
        "grpc_floor_stream_msgs_per_cpu_s": round(stream_cpu, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 s per phase instead of 5")
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as JSON")
    ap.add_argument("--seconds", type=float, help="seconds per phase (overrides --quick)")
    ap.add_argument("--size", type=int, default=64, help="payload bytes (1..1 MiB)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server process
    args = ap.parse_args()
    if args.serve:
        uvloop.run(_serve())
        return 0
    if not 1 <= args.size <= MAX_SIZE:
        ap.error(f"--size must be 1..{MAX_SIZE}")
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    if not 0 < seconds <= 600:
        ap.error("--seconds must be in (0, 600]")

    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = _read_port(server)
        figures = uvloop.run(_client(int(line), server.pid, seconds, args.size))
    finally:
        server.stdin.close()  # the server's signal to stop
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    print(f"gRPC floor, python {sys.version.split()[0]}, grpcio {grpc.__version__}, uvloop {uvloop.__version__}, "
          f"{os.cpu_count()} cores, {args.size}-byte payloads, {seconds:g} s per phase, loopback")
    f = figures
    print(f"{'':22}{'per s (wall)':>14}{'per CPU-s':>12}   (CPU = client + server process)")
    print(f"  unary, 1 in flight  {f['grpc_floor_unary_c1_per_s']:>14,.0f}{f['grpc_floor_unary_c1_per_cpu_s']:>12,.0f}"
          f"   p50 {f['grpc_floor_p50_ms']:.3f} ms  p99 {f['grpc_floor_p99_ms']:.3f} ms")
    print(f"  unary, {CONCURRENCY} in flight "
          f"{f['grpc_floor_unary_c64_per_s']:>14,.0f}{f['grpc_floor_unary_c64_per_cpu_s']:>12,.0f}")
    print(f"  bidi stream msgs    {f['grpc_floor_stream_msgs_per_s']:>14,.0f}{f['grpc_floor_stream_msgs_per_cpu_s']:>12,.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2, sort_keys=True)
    return 0


def _read_port(server: subprocess.Popen) -> str:
    """The server's first stdout line, its port; bounded wait."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(server.stdout, selectors.EVENT_READ)
        if not sel.select(START_TIMEOUT_S):
            raise RuntimeError(f"echo server did not start within {START_TIMEOUT_S} s")
    line = server.stdout.readline().strip()
    if not line.isdigit():
        raise RuntimeError(f"echo server failed to start (exit {server.poll()})")
    return line


if __name__ == "__main__":
    sys.exit(main())
