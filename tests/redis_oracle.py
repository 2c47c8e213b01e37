"""The real thing: Debian's redis-server, started by the tests, spoken to in raw RESP2.

`RedisOracle.call(*argv)` returns a reply in the engine's value model
(`xraft.node.engine.replies`): bytes, int, None (null bulk), NULL_ARRAY, list,
Status, or a `RedisReplyError` value (not raised) for '-' replies, so a test can
compare `oracle.call(...)` with `engine_call(db, ...)` directly.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

from xraft.node.engine.errors import EngineError
from xraft.node.engine.replies import NULL_ARRAY, Status, to_resp2_value


class RedisReplyError(EngineError):
    """An error reply, as a value."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_path():
    return shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)


class RedisOracle:
    def __init__(self, extra_config=()):
        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server not installed (apt-get install -y redis-server)")
        self.dir = tempfile.mkdtemp(prefix="xraft-oracle-")
        # free_port() can race with other processes: retry on a new port if the server dies.
        for attempt in range(5):
            self.port = free_port()
            args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
                    "--logfile", os.path.join(self.dir, "redis.log"), *extra_config]
            if "--cluster-enabled" in extra_config and "--cluster-port" not in extra_config:
                # The default bus port is port + 10000: above 65535 for a high ephemeral
                # port (redis exits), or taken. A free one of its own, chosen per attempt.
                args += ["--cluster-port", str(free_port())]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 30
            while True:
                try:
                    self._connect()
                    return
                except OSError:
                    if self.proc.poll() is not None or time.time() > deadline:
                        break
                    time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        try:
            log = open(os.path.join(self.dir, "redis.log")).read()[-2000:]
        except OSError:
            log = "(no log)"
        raise RuntimeError("redis-server did not start:\n" + log)

    def _connect(self):
        # generous timeout: CI machines are small and busy
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def reconnect(self):
        """After a transport error the reply stream may be out of step: start afresh."""
        try:
            self.sock.close()
        except OSError:
            pass
        self._connect()

    # -- RESP2 ---------------------------------------------------------------
    def send(self, *argv):
        out = [b"*%d\r\n" % len(argv)]
        for a in argv:
            if isinstance(a, str):
                a = a.encode()
            elif isinstance(a, int):
                a = str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            self._fill()

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("redis-server closed the connection")
        self.buf += chunk

    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return Status(rest.decode())
        if t == b"-":
            return RedisReplyError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            data = bytes(self.buf[:n])
            del self.buf[: n + 2]
            return data
        if t == b"*":
            n = int(rest)
            if n < 0:
                return NULL_ARRAY
            return [self.read() for _ in range(n)]
        raise ValueError(f"unexpected RESP2 line {line!r}")

    def call(self, *argv):
        try:
            self.send(*argv)
            return self.read()
        except BaseException:
            # a half-read reply would answer the next command: never reuse the socket
            self.reconnect()
            raise

    # Settings tests may change; reset() puts them back so one test cannot leak into the next.
    DEFAULTS = {
        "stream-node-max-bytes": "4096",
        "stream-node-max-entries": "100",
        "list-max-listpack-size": "-2",
        "list-compress-depth": "0",
        "hash-max-listpack-entries": "128",
        "hash-max-listpack-value": "64",
    }

    def reset(self):
        self.call("FLUSHALL")
        for k, v in self.DEFAULTS.items():
            self.call("CONFIG", "SET", k, v)

    def flush(self):
        self.reset()

    def close(self):
        try:
            self.sock.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.dir, ignore_errors=True)


def engine_call(db, *argv, now_ms: int = 0):
    """Run a command on an xraft keyspace; reply in RESP2 shape, errors as values."""
    from xraft.node.engine.commands import execute

    args = [a.encode() if isinstance(a, str) else (str(a).encode() if isinstance(a, int) else a) for a in argv]
    try:
        return to_resp2_value(execute(db, args, now_ms))
    except EngineError as e:
        return RedisReplyError(e.message)
