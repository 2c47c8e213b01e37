"""The cyclic garbage collector paused around a bulk load, and the load's objects made old.

A bulk load (a snapshot, or a slot move's STAGE chunk holding a stream with a big PEL) makes
tens of thousands to millions of GC-tracked objects that all stay alive: a NACK and its
StreamIDs per pending entry, consumers, rax nodes. With the collector on, the allocations
trigger young collections that scan them again and again (a generation-1 collection inside a
move's STAGE decode took 36-59 ms, bench/README.md "Session 13 ... movewait3"); the collector
holds the GIL, so even a decode in the node's prepare thread stops that node's event loop
meanwhile. Nothing cyclic becomes garbage during a load.

Pausing alone only moves the cost: the young generation then holds every object the load
made, and the first collection after it scans them all (and a generation-1 collection scans
them once more later). So a block leaves through gc.freeze() + gc.unfreeze(), which moves
every tracked object of generations 0 and 1 into the oldest generation without scanning it
(two list splices, O(1)) and zeroes the young count. The loaded objects are then looked at
only by full collections, which the node's thresholds keep rare (server/gc_policy.py), as
objects built by many commands over time would be. The price: young cyclic garbage of other
code that is alive at that moment (the event loop's futures, tracebacks) waits for the next
full collection instead of a young one. Nothing in the node freezes objects for another
reason (the snapshot child is a forked process that only disables the collector); a caller
that did would see them thawed here.

gc.disable() is process-wide and blocks run in several threads (the loop, the prepare
thread, a snapshot's decode in a thread of its own), so the switch is shared: a block that finds
the collector on leaves a token in _resume (after turning it off), and the last block out
turns it back on if there is a token. Every step is one call (list.append / pop / clear,
gc.disable / enable), each atomic under the GIL: this layer imports no threading
(pyproject's import contracts). The order matters: a token is left only after the disable,
and taken only before the enable, so whichever block leaves last sees every token left by
a block that turned the collector off, and nothing leaves it off. A block that begins while
another is leaving may see the collector come back on early (a collection may then run
inside it); that only costs what an unpaused load costs.

The fsm's state never depends on any of this: only when the collector runs does.
"""
from __future__ import annotations

import contextlib
import gc

_inside: list = []      # one token per block now inside gc_paused, in any thread
_resume: list = []      # one token per block that found the collector on (see the module doc)


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside the block; what is alive when it ends (the load's
    objects) goes to the oldest generation; the collector resumes if it was on."""
    _inside.append(None)
    was_on = gc.isenabled()
    gc.disable()
    if was_on:
        _resume.append(None)
    try:
        yield
    finally:
        gc.freeze()                 # every young object to the permanent generation,
        gc.unfreeze()               # and from there to the oldest: no scan, no young count
        _inside.pop()
        if not _inside and _resume:
            _resume.clear()
            gc.enable()
