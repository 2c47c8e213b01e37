"""RESP benchmark: the wire codec in process, and the RESP server over the wire, beside redis-server.

    python bench/resp.py                 # full run (a few minutes)
    python bench/resp.py --quick         # smaller smoke run
    python bench/resp.py --json out.json # also write the headline figures

In process (one core, this process; rates per CPU-second with the wall-clock
rate beside them, best of 3 runs, 1 with --quick):

  parse     `RespParser` (node/server/resp.py) over a buffer of pipelined
            commands fed in 64 KiB reads (`feed` a read, then `next_command`
            until it returns None), as a connection sees them:
              xadd    XADD bench * f v          (5 arguments, 46 bytes)
              ping    PING                      (1 argument, 14 bytes)
              args20  XADD bench * 8 pairs last (20 arguments, 291 bytes)
  encode    `encode_reply(value, 2)` of typical replies:
              xrange10  a 10-entry XRANGE reply, entries of 2 field-value pairs
              bulks10   a list of 10 bulk strings of 10 bytes
              xadd_id   one bulk stream ID (the XADD reply)

Over the wire, in the same run, against (a) the single-node dev RESP server
(`python -m xraft.node.server.resp_server`, LocalBackend: no Raft, no WAL, so
the protocol layer and the asyncio loop's own cost) and (b) a private
redis-server (`--save '' --appendonly no`), each started on a free port and
killed at the end:

    redis-benchmark -q -n N -c 50 -P 16 -t ping_inline | ping_mbulk | lpush
    redis-benchmark -q -n N -c 50 -P 16 XADD bench '*' f v

(`-t ping,lpush` split into one invocation per test, so the server's CPU time
can be charged to each.) Reported: requests/s as redis-benchmark prints them
(wall clock; redis-benchmark itself takes one of the machine's cores), and
requests per CPU-second of the server process (utime+stime from /proc), which
holds up when the shared machine is busy; /proc counts CPU in 10 ms ticks,
so redis-server's per-CPU figures (a fraction of a second per run) are coarse,
the more so with --quick. Best of 3 runs (1 with --quick).
"""
import argparse
import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from xraft.node.server.resp import RespParser, encode_command, encode_reply

READ_SIZE = 64 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 30

PARSE_CASES = {
    "xadd": [b"XADD", b"bench", b"*", b"f", b"v"],
    "ping": [b"PING"],
    "args20": [b"XADD", b"bench", b"*"] + [b"field-%02d" % (i // 2) if i % 2 == 0 else b"value-%04d" % i
                                          for i in range(16)] + [b"last"],
}
assert len(PARSE_CASES["args20"]) == 20
ENCODE_CASES = {
    "xrange10": [[b"1700000000000-%d" % i, [b"sensor-id", b"1234", b"temperature", b"19.8"]]
                 for i in range(10)],
    "bulks10": [b"value-%04d" % i for i in range(10)],
    "xadd_id": b"1700000000000-0",
}


# ----------------------------------------------------------------------------- timing

def _now():
    """(wall, CPU) seconds of this process."""
    return time.perf_counter(), time.process_time()


def _rates(count, t0, t1):
    """(per CPU-second, per wall-second)."""
    return tuple(count / (b - a) if b > a else float("inf") for a, b in ((t0[1], t1[1]), (t0[0], t1[0])))


def best_of(runs, measure):
    """Highest rates of `runs` runs: the least disturbed run on a shared machine."""
    results = [measure() for _ in range(runs)]
    return tuple(max(r[i] for r in results) for i in range(len(results[0])))


# ----------------------------------------------------------------------------- in process

def parse_speed(argv, n):
    """Commands/s parsed from n pipelined copies of argv, fed in 64 KiB reads."""
    data = encode_command(argv) * n
    reads = [data[i:i + READ_SIZE] for i in range(0, len(data), READ_SIZE)]
    del data

    def measure():
        gc.collect()
        p = RespParser()
        feed, nxt = p.feed, p.next_command
        count = 0
        t0 = _now()
        for chunk in reads:
            feed(chunk)
            while nxt() is not None:
                count += 1
        t1 = _now()
        assert count == n, (count, n)
        return _rates(n, t0, t1)
    return measure


def encode_speed(value, n):
    """Replies/s encoded by encode_reply(value, 2)."""
    def measure():
        gc.collect()
        enc = encode_reply
        t0 = _now()
        for _ in range(n):
            enc(value, 2)
        t1 = _now()
        return _rates(n, t0, t1)
    return measure


# ----------------------------------------------------------------------------- over the wire

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu(pid):
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Server:
    """A server process on a free port, waited for until it answers PING."""

    def __init__(self, name, argv_for_port):
        self.name = name
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="xraft-bench-resp-")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(argv_for_port(self.port, self.dir), stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.time() + START_TIMEOUT_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"{name} did not start: {self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self):
        try:
            with open(os.path.join(self.dir, "server.log"), "rb") as fh:
                return fh.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def cpu(self):
        return _proc_cpu(self.proc.pid)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def xraft_server():
    return Server("xraft dev RESP server", lambda port, d: [
        sys.executable, "-m", "xraft.node.server.resp_server", "--host", "127.0.0.1", "--port", str(port)])


def redis_server():
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    return Server("redis-server", lambda port, d: [
        exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", d, "--daemonize", "no"])


_RATE = re.compile(r"^(.+?): ([0-9.]+) requests per second", re.M)


def redis_benchmark(server, n, args):
    """(requests/s as redis-benchmark reports it, requests per server CPU-second)."""
    exe = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    cpu0 = server.cpu()
    out = subprocess.run([exe, "-h", "127.0.0.1", "-p", str(server.port), "-q", "-n", str(n),
                          "-c", "50", "-P", "16", *args],
                         capture_output=True, text=True, timeout=900).stdout
    cpu1 = server.cpu()
    rates = _RATE.findall(out.replace("\r", "\n"))
    if len(rates) != 1:
        raise RuntimeError(f"redis-benchmark {args} against {server.name} said: {out[-500:]!r}")
    return float(rates[0][1]), (n / (cpu1 - cpu0) if cpu1 > cpu0 else float("inf"))


WIRE_TESTS = {
    "ping_inline": ["-t", "ping_inline"],
    "ping": ["-t", "ping_mbulk"],
    "lpush": ["-t", "lpush"],
    "xadd": ["XADD", "bench", "*", "f", "v"],
}


def wire_speed(server, n, runs):
    return {name: best_of(runs, lambda: redis_benchmark(server, n, args)) for name, args in WIRE_TESTS.items()}


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller smoke run")
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as JSON")
    args = ap.parse_args(argv)
    n_parse = 30_000 if args.quick else 300_000
    n_encode = 30_000 if args.quick else 300_000
    n_wire = 20_000 if args.quick else 200_000
    runs = 1 if args.quick else 3
    figures = {}

    print(f"RESP codec in process, python {sys.version.split()[0]}, one core, best of {runs}; "
          f"per CPU-second (wall-clock)")
    for name, argv_ in PARSE_CASES.items():
        cpu, wall = best_of(runs, parse_speed(argv_, n_parse))
        size = len(encode_command(argv_))
        print(f"  parse  {name:<9} {len(argv_):>2} args {size:>4} B  {cpu:>11,.0f} cmds/s  ({wall:>11,.0f})"
              f"  {cpu * size / 1e6:6.1f} MB/s")
        figures[f"resp_parse_{name}_per_s"] = round(cpu)
        figures[f"resp_parse_{name}_per_s_wall"] = round(wall)
    for name, value in ENCODE_CASES.items():
        cpu, wall = best_of(runs, encode_speed(value, n_encode))
        size = len(encode_reply(value, 2))
        print(f"  encode {name:<9}         {size:>4} B  {cpu:>11,.0f} replies/s ({wall:>10,.0f})"
              f"  {cpu * size / 1e6:6.1f} MB/s")
        figures[f"resp_encode_{name}_per_s"] = round(cpu)
        figures[f"resp_encode_{name}_per_s_wall"] = round(wall)

    print(f"over the wire: redis-benchmark -q -n {n_wire} -c 50 -P 16, best of {runs}; "
          f"requests/s (wall) and per server CPU-second")
    results = {}
    for key, start in (("resp_server", xraft_server), ("redis", redis_server)):
        server = start()
        try:
            results[key] = wire_speed(server, n_wire, runs)
        finally:
            server.close()
    print(f"  {'test':<12}{'xraft dev server':>18}{'per CPU-s':>12}{'redis-server':>16}{'per CPU-s':>12}"
          f"{'ratio':>8}")
    for name in WIRE_TESTS:
        ours, ours_cpu = results["resp_server"][name]
        theirs, theirs_cpu = results["redis"][name]
        print(f"  {name:<12}{ours:>18,.0f}{ours_cpu:>12,.0f}{theirs:>16,.0f}{theirs_cpu:>12,.0f}"
              f"{ours / theirs:>8.3f}")
        for key in ("resp_server", "redis"):
            wall, cpu = results[key][name]
            figures[f"{key}_{name}_per_s"] = round(wall)
            figures[f"{key}_{name}_per_server_cpu_s"] = round(cpu)
    figures["parse_commands"] = n_parse
    figures["encode_replies"] = n_encode
    figures["wire_requests"] = n_wire
    figures["runs"] = runs

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2, sort_keys=True)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
