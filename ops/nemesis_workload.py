"""The nemesis run's clients: threads doing stream, group and list operations over RESP
and the SDK, every operation recorded as invoke -> ok / fail / info (ops/nemesis_check.py
says what those mean and what the checkers read).

Keys share one hash tag, so they live in one slot (BLPOP/BLMOVE over two lists) on a
sharded cluster too:

    {nemesis}s      the stream: XADD (RESP and SDK) with unique values, group `g` on it
    {nemesis}l/l2   lists: LPUSH unique values; BLPOP from both; BLMOVE l -> l2
    {nemesis}r1/r2  registers for the linearizability checker: XADD = write, XREVRANGE
                    + - COUNT 1 = read of the newest value

Outcomes: a reply is ok; an error that says nothing happened (redirects, NOTLEADER,
UNAVAILABLE, TIMEOUT before proposing, command errors) is fail; UNKNOWNOUTCOME, a lost
connection or a client-side timeout is info. A process whose op ended in info takes a
new name (Jepsen's rule: its op may still be in flight, so the process never again has
a single outstanding op).
"""
from __future__ import annotations

import json
import random
import threading
import time
from typing import Any, Callable, Optional

import redis

from . import local_cluster as lc

TAG = "{nemesis}"
STREAM, LIST, LIST2, GROUP = TAG + "s", TAG + "l", TAG + "l2", "g"
REGISTERS = (TAG + "r1", TAG + "r2")
CLAIM_MIN_IDLE_MS = 2000
BLOCK_MS = 500
# A client gives up on a reply after this (the op is info); longer than every BLOCK.
OP_TIMEOUT_S = 3.0
MAX_REDIRECTS = 5
# Error prefixes after which the command certainly did not happen (node/server/wire_errors.py).
NOTHING_HAPPENED = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOTLEADER", "UNAVAILABLE", "TIMEOUT", "LOADING",
                    "BUSY", "ERR", "WRONGTYPE", "NOGROUP", "BUSYGROUP", "CROSSSLOT", "OOM")


class Unknown(Exception):
    """The operation's outcome is unknown (info)."""


class Failed(Exception):
    """The operation certainly did not happen (fail)."""


class History:
    """Thread-safe history: appended in memory and to a JSONL file, line by line."""

    def __init__(self, path: str):
        self.t0 = time.monotonic()
        self.records: list = []
        self._lock = threading.Lock()
        self._next = 0
        self._file = open(path, "w")

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def _write(self, rec: dict) -> None:
        self.records.append(rec)
        self._file.write(json.dumps(rec) + "\n")

    def invoke(self, process: str, f: str, key, value=None, **extra) -> int:
        with self._lock:
            self._next += 1
            self._write({"op": self._next, "time": self.now(), "process": process, "type": "invoke", "f": f,
                         "key": key, "value": value, **extra})
            return self._next

    def complete(self, op: int, process: str, type_: str, f: str, key, value=None, result=None,
                 error: Optional[str] = None) -> None:
        rec = {"op": op, "time": None, "process": process, "type": type_, "f": f, "key": key, "value": value,
               "result": result}
        if error:
            rec["error"] = error[:200]
        with self._lock:
            rec["time"] = self.now()
            self._write(rec)

    def event(self, process: str, f: str, value: Any) -> None:
        with self._lock:
            self._write({"op": None, "time": self.now(), "process": process, "type": "info", "f": f,
                         "value": value})

    def close(self) -> None:
        with self._lock:
            self._file.close()


# -- RESP with redirects ---------------------------------------------------------------

def _refused_connect(e: Exception) -> bool:
    """redis-py's ConnectionError for a connect that was refused (ECONNREFUSED): it wraps the
    OSError of the connect as the exception's context or cause."""
    cause = e.__cause__ or e.__context__
    if isinstance(cause, ConnectionRefusedError):
        return True
    return "Error 111 connecting to" in str(e)


class Resp:
    """A RESP client for the cluster that follows MOVED and tries other nodes when one
    says it is not the leader or cannot be reached before anything was sent."""

    def __init__(self, addrs: list, rng: random.Random, timeout: float = OP_TIMEOUT_S):
        self.addrs = list(addrs)
        self.rng = rng
        self.timeout = timeout
        self.addr = rng.choice(self.addrs)
        self._conns: dict = {}

    def _conn(self, addr: str) -> redis.Redis:
        if addr not in self._conns:
            conn = lc.resp_client(addr, self.timeout, decode_responses=True)
            conn.response_callbacks.clear()   # raw replies: the history holds what the server said
            self._conns[addr] = conn
        return self._conns[addr]

    def call(self, *args):
        """The reply; Failed when the command certainly did not happen; Unknown otherwise."""
        last = "no node tried"
        for _ in range(MAX_REDIRECTS):
            conn = self._conn(self.addr)
            try:
                return conn.execute_command(*args)
            except redis.exceptions.ConnectionError as e:
                addr = self.addr
                self._forget()
                if _refused_connect(e):
                    # The TCP connect was refused, and this client never retries by itself
                    # (lc.resp_client): the command was never sent.
                    raise Failed(f"{addr}: {e}")
                # Any other connection error may have come after the command went out.
                raise Unknown(f"{addr}: {e}")
            except redis.exceptions.TimeoutError as e:
                addr = self.addr
                self._forget()
                raise Unknown(f"{addr}: timeout {e}")
            except redis.exceptions.ResponseError as e:
                text = _error_text(e)
                word = text.split(" ", 1)[0]
                if word == "MOVED":
                    self.addr = text.split()[-1]
                    last = text
                    continue
                if word in ("NOTLEADER", "UNAVAILABLE", "TRYAGAIN", "CLUSTERDOWN", "LOADING"):
                    last = text
                    self.addr = self.rng.choice(self.addrs)
                    time.sleep(0.05)
                    continue
                if word in NOTHING_HAPPENED:
                    raise Failed(text)
                raise Unknown(text)
        raise Failed(f"gave up after {MAX_REDIRECTS} redirects: {last}")

    def _forget(self) -> None:
        conn = self._conns.pop(self.addr, None)
        if conn is not None:
            conn.close()
        self.addr = self.rng.choice(self.addrs)

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()


def _error_text(e: redis.exceptions.ResponseError) -> str:
    if isinstance(e, redis.exceptions.MovedError):
        return f"MOVED {e.slot_id} {e.host}:{e.port}"
    if isinstance(e, redis.exceptions.TryAgainError):
        return "TRYAGAIN " + str(e)
    if isinstance(e, redis.exceptions.ClusterDownError):
        return "CLUSTERDOWN " + str(e)
    if isinstance(e, redis.exceptions.BusyLoadingError):
        return "LOADING " + str(e)
    return str(e)


def sdk_outcome(e: BaseException) -> str:
    """fail when the SDK says nothing happened (retriable errors, command errors), else info."""
    from xraft.client import errors
    if isinstance(e, errors.UnknownOutcomeError) or isinstance(e, TimeoutError):
        return "info"
    if isinstance(e, errors.XRaftError) and (e.retriable or type(e).__name__ in (
            "CommandError", "WrongTypeError", "NoGroupError", "BusyGroupError", "CrossSlotError")):
        return "fail"
    return "info"


# -- the workers -------------------------------------------------------------------------

class Worker(threading.Thread):
    """One client process: calls `step` until stopped; each step records its own ops."""

    def __init__(self, name: str, history: History, stop: threading.Event, seed: int, pause_s: float):
        super().__init__(name=name, daemon=True)
        self.base, self.generation = name, 0
        self.history, self.stop_event = history, stop
        self.rng = random.Random(seed)
        self.pause_s = pause_s
        self.counter = 0
        self.error: Optional[BaseException] = None

    @property
    def process(self) -> str:
        return f"{self.base}.{self.generation}" if self.generation else self.base

    def unique(self) -> str:
        self.counter += 1
        return f"{self.process}-{self.counter}"

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.step()
                self.stop_event.wait(self.pause_s * self.rng.uniform(0.5, 1.5))
        except BaseException as e:   # a bug in the workload: the run reports it, never hides it
            self.error = e
        finally:
            self.close()

    def record(self, f: str, key, value, call: Callable[[], Any], convert=lambda r: r, **extra) -> tuple:
        """Invoke, call, complete. Returns (type, result)."""
        op = self.history.invoke(self.process, f, key, value, **extra)
        try:
            reply = call()
        except Failed as e:
            self.history.complete(op, self.process, "fail", f, key, value, error=str(e))
            return "fail", None
        except Unknown as e:
            self._info(op, f, key, value, str(e))
            return "info", None
        except Exception as e:
            outcome = sdk_outcome(e)
            if outcome == "fail":
                self.history.complete(op, self.process, "fail", f, key, value, error=repr(e))
            else:
                self._info(op, f, key, value, repr(e))
            return outcome, None
        try:
            result = convert(reply)
        except Exception:    # a reply the workload cannot read is its own bug: the run reports it
            self._info(op, f, key, value, f"unreadable reply {reply!r}"[:200])
            raise
        self.history.complete(op, self.process, "ok", f, key, value, result=result)
        return "ok", result

    def _info(self, op, f, key, value, error) -> None:
        self.history.complete(op, self.process, "info", f, key, value, error=error)
        self.generation += 1

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class RespWorker(Worker):
    def __init__(self, name, history, stop, seed, pause_s, addrs):
        super().__init__(name, history, stop, seed, pause_s)
        self.resp = Resp(addrs, self.rng)

    def close(self) -> None:
        self.resp.close()


class RespAdder(RespWorker):
    def step(self):
        v = self.unique()
        self.record("xadd", STREAM, v, lambda: self.resp.call("XADD", STREAM, "*", "v", v))


class RespGroupReader(RespWorker):
    """XREADGROUP > with BLOCK, then XACK most of what it got (the rest stays pending for claims)."""

    def step(self):
        consumer = self.base
        _, got = self.record("xreadgroup", STREAM, None, lambda: self.resp.call(
            "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", 10, "BLOCK", BLOCK_MS, "STREAMS", STREAM, ">",
            ), convert=entry_ids, consumer=consumer)
        ack = [i for i in got or [] if self.rng.random() < 0.7]
        if ack:
            self.record("xack", STREAM, ack, lambda: self.resp.call("XACK", STREAM, GROUP, *ack))


class RespClaimer(RespWorker):
    def step(self):
        consumer = self.base
        _, got = self.record("xautoclaim", STREAM, None, lambda: self.resp.call(
            "XAUTOCLAIM", STREAM, GROUP, consumer, CLAIM_MIN_IDLE_MS, "0-0", "COUNT", 20, "JUSTID"),
            convert=lambda r: list(r[1]), consumer=consumer, min_idle_ms=CLAIM_MIN_IDLE_MS)
        if got:
            self.record("xack", STREAM, got, lambda: self.resp.call("XACK", STREAM, GROUP, *got))


class RespPendingReader(RespWorker):
    def step(self):
        self.record("xpending", STREAM, None, lambda: self.resp.call("XPENDING", STREAM, GROUP, "-", "+", 100),
                    convert=lambda r: [[p[0], p[1], p[3]] for p in r])


class RespReader(RespWorker):
    def step(self):
        if self.rng.random() < 0.5:
            self.record("xlen", STREAM, None, lambda: self.resp.call("XLEN", STREAM))
        else:
            self.record("xrange", STREAM, None, lambda: self.resp.call("XRANGE", STREAM, "-", "+", "COUNT", 20),
                        convert=range_ids)


class RespListPusher(RespWorker):
    def step(self):
        v = self.unique()
        self.record("lpush", LIST, v, lambda: self.resp.call("LPUSH", LIST, v))


class RespListPopper(RespWorker):
    def step(self):
        wait_s = BLOCK_MS / 1000
        if self.rng.random() < 0.7:
            self.record("blpop", LIST, None, lambda: self.resp.call("BLPOP", LIST, LIST2, wait_s),
                        convert=lambda r: None if r is None else r[1])
        else:
            self.record("blmove", LIST, None, lambda: self.resp.call("BLMOVE", LIST, LIST2, "RIGHT", "LEFT", wait_s))


class RespRegister(RespWorker):
    def step(self):
        key = self.rng.choice(REGISTERS)
        if self.rng.random() < 0.5:
            v = self.unique()
            self.record("reg-write", key, v, lambda: self.resp.call("XADD", key, "*", "v", v))
        else:
            self.record("reg-read", key, None, lambda: self.resp.call("XREVRANGE", key, "+", "-", "COUNT", 1),
                        convert=lambda r: r[0][1][1] if r else None)


class SdkWorker(Worker):
    def __init__(self, name, history, stop, seed, pause_s, seeds):
        super().__init__(name, history, stop, seed, pause_s)
        from xraft.client.sync import Client
        self.client = Client(seeds, timeout=OP_TIMEOUT_S)

    def close(self) -> None:
        self.client.close()


class SdkAdder(SdkWorker):
    def step(self):
        v = self.unique()
        self.record("xadd", STREAM, v, lambda: self.client.xadd(STREAM, {"v": v}), convert=str)


class SdkGroupReader(SdkWorker):
    """XREADGROUP > through gRPC (BLOCK), acking most of it."""

    def step(self):
        consumer = self.base
        _, got = self.record("xreadgroup", STREAM, None, lambda: self.client.xreadgroup(
            GROUP, consumer, {STREAM: ">"}, count=10, block_ms=BLOCK_MS),
            convert=lambda r: [str(e.id) for entries in r.values() for e in entries], consumer=consumer)
        ack = [i for i in got or [] if self.rng.random() < 0.7]
        if ack:
            self.record("xack", STREAM, ack, lambda: self.client.xack(STREAM, GROUP, *ack))


class SdkConsumer(SdkWorker):
    """gRPC Consume: one streaming session; each delivery is an op `consume` from the moment
    the worker waits for it. After a failover the session replays this consumer's pending
    entries (at least once), so a repeat to the same consumer is not a second `>` delivery
    (nemesis_check knows). The session is closed from outside at the end (interrupt)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.session = None

    def step(self):
        consumer = self.base
        self.interrupt()     # the session a failure ended, if any
        opened = self.history.now()   # no delivery of this session happened before (nemesis_check)
        self.session = self.client.consume([STREAM], GROUP, consumer, max_unacked=50)
        deliveries = iter(self.session)
        while not self.stop_event.is_set():
            holder = []

            def next_delivery():
                holder.append(next(deliveries))
                return [str(holder[0].id)]
            outcome, _ = self.record("consume", STREAM, None, next_delivery, consumer=consumer,
                                     session_opened=opened)
            if outcome != "ok":
                return          # the session ended: a new one on the next step
            if self.rng.random() < 0.7:
                d = holder[0]
                self.record("xack", STREAM, [str(d.id)], d.ack)

    def interrupt(self) -> None:
        session = self.session
        if session is not None:
            try:
                session.close()
            except Exception:   # already ended: nothing left to stop
                pass


def entry_ids(reply) -> list:
    """The ids in a raw XREADGROUP reply [[key, [[id, fields], ...]], ...] (None: nothing)."""
    return [e[0] for _key, entries in reply or [] for e in entries]


def range_ids(reply) -> list:
    """The ids in a raw XRANGE reply [[id, fields], ...]."""
    return [e[0] for e in reply]


WORKERS = (
    ("resp-xadd-1", RespAdder), ("resp-xadd-2", RespAdder), ("sdk-xadd", SdkAdder),
    ("resp-group-1", RespGroupReader), ("sdk-group-1", SdkGroupReader), ("sdk-consume", SdkConsumer),
    ("resp-claim", RespClaimer), ("resp-pending", RespPendingReader), ("resp-read", RespReader),
    ("resp-lpush", RespListPusher), ("resp-lpop", RespListPopper),
    ("resp-reg-1", RespRegister), ("resp-reg-2", RespRegister),
)


def start_workers(history: History, stop: threading.Event, seed: int, resp_addrs: list, grpc_addrs: list,
                  pause_s: float = 0.05) -> list:
    workers = []
    for i, (name, cls) in enumerate(WORKERS):
        target = grpc_addrs if issubclass(cls, SdkWorker) else resp_addrs
        workers.append(cls(name, history, stop, seed * 1000 + i, pause_s, target))
    for w in workers:
        w.start()
    return workers
