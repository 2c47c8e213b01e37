"""The node process's cyclic garbage collector: thresholds, and the pauses it costs.

Why the defaults do not suit a node. A consumer group's pending entries are Python objects that
live as long as the entries stay unacknowledged: two GC-tracked objects per entry (the NACK and
its StreamID key, engine/groups.py), so a group holding 1M pending entries is 2M long-lived
objects. CPython 3.11 runs a full (generation 2) collection whenever the long-lived population
has grown by a quarter since the last one and ten generation-1 collections have passed; with the
default thresholds (700, 10, 10) that is every ~70k net allocations. While a group reads a
backlog (XREADGROUP of a million entries) the collector therefore re-scans the whole PEL over and
over, and its pauses grow with the PEL; every replica applies the same reads, so every node stalls
at once, and a pause longer than the election timeout would make followers campaign. (Figures:
bench/gc_pel.py, bench/README.md "Session 12 (lead): the collector and a growing PEL".)

The node's thresholds (THRESHOLDS): a young generation of 10,000 objects and a full collection
only after 100 generation-1 collections (20M net allocations) besides CPython's own quarter
rule. Young cycles (asyncio futures, tracebacks, closed connections) are still collected in
generation 0/1, whose pause is bounded by 20 x 10,000 young objects; long-lived
cyclic garbage (a deleted stream's group: NACK <-> consumer) waits for the rarer full collection
instead of being found sooner. A snapshot load and a slot move's STAGE decode run with the
collector off and leave their objects in the oldest generation (fsm/gc_pause.py), and the
snapshot child disables it; this policy is for the rest.

GcWatch records each collection's pause per generation (gc.callbacks), for INFO's `gc` section
and for reading stall traces (loop_stalls.py shows where the loop stood, not that it collected).
"""
from __future__ import annotations

import gc
import time

THRESHOLDS = (10_000, 20, 100)   # (young objects, young collections per gen 1, gen-1 collections per full)


class GcWatch:
    """Pause statistics of the collections in this process since install()."""

    def __init__(self):
        self.collections = [0, 0, 0]      # per generation, counted at each collection's end
        self.pause_s = [0.0, 0.0, 0.0]    # summed seconds per generation
        self.max_pause_s = [0.0, 0.0, 0.0]
        self._started = 0.0               # perf_counter at the running collection's start
        self._installed = False

    def install(self, thresholds=THRESHOLDS) -> None:
        """Set the thresholds and start recording. Idempotent."""
        gc.set_threshold(*thresholds)
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        # Runs inside the collector on whichever thread allocated: keep it to arithmetic.
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen = info.get("generation", 0)
        if not 0 <= gen <= 2:
            return
        pause = time.perf_counter() - self._started
        self.collections[gen] += 1
        self.pause_s[gen] += pause
        if pause > self.max_pause_s[gen]:
            self.max_pause_s[gen] = pause

    def info_fields(self) -> list:
        """[(name, value)] for INFO's `gc` section."""
        out = [("gc_enabled", int(gc.isenabled())),
               ("gc_frozen_objects", gc.get_freeze_count())]
        for gen, threshold in enumerate(gc.get_threshold()):
            out += [("gc_gen%d_threshold" % gen, threshold),
                    ("gc_gen%d_collections" % gen, self.collections[gen]),
                    ("gc_gen%d_pause_ms_total" % gen, round(self.pause_s[gen] * 1000, 3)),
                    ("gc_gen%d_pause_ms_max" % gen, round(self.max_pause_s[gen] * 1000, 3))]
        return out


# The process's one watch: node_main installs it; INFO reads it (uninstalled: counts stay 0).
WATCH = GcWatch()
