"""State machine snapshots made in a forked child, as redis' BGSAVE makes its RDB file.

Why: a group's snapshot serializes its whole state machine. On the node's one event loop that
stops every group of the node for as long as it takes (seconds at millions of entries): a
leader sends no heartbeats, its followers elect another leader, and the clients' writes in
flight end with an unknown outcome. A forked child sees the state frozen at the fork (the
kernel's copy-on-write), serializes it and writes the snapshot's .tmp file while the parent
goes on applying, replicating and serving. The parent then publishes the file (rename,
directory fsync, WAL marker: DiskStorage.adopt_snapshot) as a short storage job.

    parent (loop thread)                 child
    plan = storage.plan_snapshot(...)
    fork() ------------------------------> signals to defaults, dies with the parent (prctl),
    goes on; a thread waits on the pipe    gc off, nice 19; data = make(); tmp = plan.write(data)
                                           writes RESULT (magic, data length) to the pipe,
    <-------------------------------------  _exit(0) (no atexit, no flush of inherited buffers)
    result checked (exit status 0, a whole RESULT); then adopt_snapshot(plan, tmp, length)

The child touches no socket, lock or thread of the parent: it runs only the pure serializer
and plain file I/O, then _exit()s. A child that fails (exit status, a short RESULT, fork
refused for memory) is a SnapshotChildError: the caller keeps its log and tries again later
(or makes the image in process). Memory: pages the parent writes while the child runs are
copied, up to the state's size in the worst case (documented in docs/architecture.md).

XRAFT_TEST_SNAPSHOT_CHILD (tests only): "sleep:S" makes the child sleep S seconds before
serializing, "wait:PATH" wait until PATH exists (60 s at most); "fail" makes it exit with
status 1 before writing anything.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
import struct
import sys
import time
from typing import Callable

from ..invariant import invariant

RESULT = struct.Struct(">8sQ")              # magic, data length
RESULT_MAGIC = b"XRSNAPOK"
TEST_ENV = "XRAFT_TEST_SNAPSHOT_CHILD"
KILL_WAIT_S = 2.0                           # kill() waits at most this long for the child to die
# The child's CPU priority (nice increment). Every replica of a group reaches the same snapshot
# index at about the same time, so on a machine with fewer cores than nodes three children
# would take the cores from the nodes' loops; niced, they use what the loops leave (bench/README.md,
# session 13: XADD into a 10M-entry stream while three images ran).
CHILD_NICE = 19
_PR_SET_PDEATHSIG = 1
_CHILD_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")


class SnapshotChildError(Exception):
    """The child did not produce a snapshot file (why: its exit status or what it wrote)."""


def available() -> bool:
    """Snapshots in a child need fork() and prctl (Linux)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


class ChildImage:
    """One snapshot child. start() forks it, synchronously: the image is the state at that
    instant, so the caller forks right where it read the index the image is named by (a fork
    one loop iteration later would image entries applied since). wait() returns the image's
    data length once the child exited cleanly (SnapshotChildError otherwise); kill() ends it
    at once (a closing group: its directory may be reopened or deleted right after, so
    nothing of the child may linger)."""

    def __init__(self, make: Callable[[], bytes], write: Callable[[bytes], str], tmp: str):
        self._make = make
        self._write = write
        self.tmp = tmp            # the file write() makes (removed if the child fails or is killed)
        self.pid = 0
        self._r = -1              # the pipe's read end, the parent's (wait() closes it)

    def start(self) -> None:
        parent = os.getpid()
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            raise SnapshotChildError(f"fork refused: {exc}") from exc
        if pid == 0:
            _child(parent, r, w, self._make, self._write)    # never returns
        self.pid, self._r = pid, r
        os.close(w)

    async def wait(self) -> int:
        invariant(self.pid > 0 and self._r >= 0, "wait() on a started child, once")
        r, self._r = self._r, -1
        waiting = asyncio.get_running_loop().run_in_executor(None, _wait_child, self.pid, r)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The pipe's writer dies with the child: the waiting thread sees EOF, reaps it and
            # ends, and the half-written .tmp goes (a node opening the directory deletes it too).
            self.kill()
            waiting.add_done_callback(lambda f: (f.cancelled() or f.exception(), _remove(self.tmp)))
            raise
        except BaseException:
            _remove(self.tmp)
            raise

    async def run(self) -> int:
        self.start()
        return await self.wait()

    def kill(self) -> None:
        """SIGKILL, and return once the child is dead (a zombie holds no descriptor, no lock):
        the caller may reopen the group's directory right after (bounded: KILL_WAIT_S)."""
        if not self.pid:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + KILL_WAIT_S
        while _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.001)


async def image_in_child(make: Callable[[], bytes], write: Callable[[bytes], str], tmp: str) -> int:
    """ChildImage(make, write, tmp).run()."""
    return await ChildImage(make, write, tmp).run()


def _wait_child(pid: int, r: int) -> int:
    """A worker thread: everything the child writes to the pipe, then its exit status."""
    try:
        chunks, size = [], 0
        while size <= RESULT.size:                   # limit: a well-behaved child writes RESULT.size
            b = os.read(r, 4096)
            if not b:
                break
            chunks.append(b)
            size += len(b)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SnapshotChildError(f"snapshot child {pid} exited with status {code}")
    if len(out) != RESULT.size:
        raise SnapshotChildError(f"snapshot child {pid} wrote {len(out)} bytes, not a {RESULT.size}-byte result")
    magic, n = RESULT.unpack(out)
    if magic != RESULT_MAGIC:
        raise SnapshotChildError(f"snapshot child {pid} wrote {out!r}, not a result")
    return n


def _child(parent: int, r: int, w: int, make: Callable[[], bytes], write: Callable[[bytes], str]) -> None:
    code = 1
    try:
        os.close(r)
        # Nothing of the parent's stays open here but stdio and the pipe: an inherited WAL
        # lock (flock) would outlive the parent's close, a socket its listener.
        os.closerange(3, w)
        os.closerange(w + 1, _max_fd())
        _detach_signals()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:                   # the parent died before prctl took
            os._exit(1)
        gc.disable()                                 # a collection would touch (copy) every page
        os.nice(CHILD_NICE)                          # the loops first: CHILD_NICE
        test = os.environ.get(TEST_ENV, "")
        if test == "fail":
            os._exit(1)
        if test.startswith("sleep:"):
            time.sleep(float(test[len("sleep:"):]))
        elif test.startswith("wait:"):              # until the test creates this file (60 s at most)
            for _ in range(6000):
                if os.path.exists(test[len("wait:"):]):
                    break
                time.sleep(0.01)
        data = make()
        write(data)
        out = memoryview(RESULT.pack(RESULT_MAGIC, len(data)))
        while out:
            out = out[os.write(w, out):]
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the status says it failed; stderr says why
        try:
            os.write(2, f"xraft snapshot child {os.getpid()}: {exc!r}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def _detach_signals() -> None:
    """The parent's signal handlers write to its event loop's wakeup fd, which the child
    shares: a signal to the child must not look like one to the parent."""
    try:
        signal.set_wakeup_fd(-1)
        for name in _CHILD_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    except ValueError:                               # not the main thread: no Python handlers here
        pass


def _alive(pid: int) -> bool:
    """Running (not yet a zombie, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _max_fd() -> int:
    try:
        return max(os.sysconf("SC_OPEN_MAX"), 1024)
    except (ValueError, OSError):
        return 1 << 16


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
