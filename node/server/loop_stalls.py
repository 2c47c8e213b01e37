"""Where a node's event loop stalls: off unless XRAFT_STALL_TRACE names a directory (benchmarks).

One event loop serves all the groups of a node, so any long synchronous step on it delays
every group's commits (bench/README.md, session 10). A watchdog thread sees the loop's
heartbeat (a callback every TICK_S) go stale for more than THRESHOLD_S and samples the loop
thread's stack every TICK_S until it beats again, then appends one report per stall to
DIR/stalls-<node id>.txt:

    stall <ms> ms at <CLOCK_MONOTONIC s> (<n> samples)
      <count>x  file:line function <- file:line caller <- ...   (innermost first)

A sample needs the GIL, so a stall inside one long C call shows the frames around it; a
stall in Python code is sampled about every switch interval. The collector is such a call,
on whichever thread allocated (a prepare thread's decode, too: it holds the GIL throughout),
so each report also lists the cyclic collections that overlapped the stall:

      gc gen<g> <ms> ms in <loop|another thread> Bounded: at most MAX_STALLS
reports per process, MAX_SAMPLES samples per stall, DEPTH frames per sample.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import threading
import time
from typing import Optional

ENV = "XRAFT_STALL_TRACE"
THRESHOLD_S = 0.010
TICK_S = 0.002
MAX_STALLS = 10_000
MAX_SAMPLES = 500
DEPTH = 14


def _stack(frame) -> str:
    out = []
    while frame is not None and len(out) < DEPTH:
        code = frame.f_code
        out.append("%s:%d %s" % (os.path.basename(code.co_filename), frame.f_lineno, code.co_name))
        frame = frame.f_back
    return " <- ".join(out)


class StallWatch:
    def __init__(self, loop: asyncio.AbstractEventLoop, path: str):
        self.loop = loop
        self.path = path
        self.stalls = 0
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="xraft-stall-watch", daemon=True)
        self._gcs: collections.deque = collections.deque(maxlen=256)   # (start, end, generation, on loop)
        self._gc_start = 0.0

    def start(self) -> None:
        self.loop.call_soon(self._on_beat)
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # Inside the collector, on the thread that allocated: arithmetic only.
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self._gcs.append((self._gc_start, time.monotonic(), info.get("generation", -1),
                              threading.get_ident() == self._loop_thread))

    def _collections(self, began: float, ended: float) -> list:
        return ["  gc gen%d %.1f ms in %s\n" % (g, (e - s) * 1e3, "loop" if on_loop else "another thread")
                for s, e, g, on_loop in list(self._gcs) if s < ended and e > began]

    def _on_beat(self) -> None:
        self._beat = time.monotonic()
        if not self._stop.is_set():
            self.loop.call_later(TICK_S, self._on_beat)

    def _watch(self) -> None:
        while not self._stop.wait(TICK_S):
            if time.monotonic() - self._beat <= THRESHOLD_S or self.stalls >= MAX_STALLS:
                continue
            began = self._beat
            samples: collections.Counter = collections.Counter()
            while time.monotonic() - self._beat > TICK_S and self._beat == began and not self._stop.is_set():
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None and sum(samples.values()) < MAX_SAMPLES:
                    samples[_stack(frame)] += 1
                del frame
                time.sleep(TICK_S)
            ended = time.monotonic()
            ms = (ended - began) * 1e3
            self.stalls += 1
            lines = ["stall %.1f ms at %.3f (%d samples)\n" % (ms, began, sum(samples.values()))]
            lines += ["  %dx  %s\n" % (n, s) for s, n in samples.most_common(4)]
            lines += self._collections(began, ended)
            with open(self.path, "a") as fh:
                fh.write("".join(lines))


def start(loop: asyncio.AbstractEventLoop, node_id: int) -> Optional[StallWatch]:
    """A running StallWatch if XRAFT_STALL_TRACE is set, else None."""
    d = os.environ.get(ENV)
    if not d:
        return None
    os.makedirs(d, exist_ok=True)
    w = StallWatch(loop, os.path.join(d, "stalls-%d.txt" % node_id))
    w.start()
    return w
