"""The node's garbage collector policy (node/server/gc_policy.py): its thresholds keep a
growing PEL from being re-scanned by full collections, and its watch counts the pauses.

Counts, not times: which collections run is decided by allocation counts alone."""
import gc
import importlib.util
import pathlib

import pytest

from xraft.node.server import gc_policy
from xraft.node.server.gc_policy import THRESHOLDS, GcWatch

PENDING = 200_000

# The measurement bench/gc_pel.py prints figures of, loaded from its file (bench/ is no package).
_spec = importlib.util.spec_from_file_location(
    "gc_pel", pathlib.Path(__file__).resolve().parents[2] / "bench" / "gc_pel.py")
GC_PEL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(GC_PEL)


@pytest.fixture
def restore_gc():
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    yield
    gc.set_threshold(*before)
    if not enabled:
        gc.disable()


def _full_collections_while_a_group_reads(thresholds) -> int:
    """Full collections while a group reads PENDING entries into its PEL (bench/gc_pel.py's
    read_backlog: the stream is built with the collector off, then collected once)."""
    result = GC_PEL.read_backlog(PENDING, thresholds)
    assert result["pending"] == PENDING
    return result["full_collections"]


def test_a_growing_pel_is_not_rescanned_by_full_collections_under_the_node_thresholds(restore_gc):
    assert _full_collections_while_a_group_reads(GC_PEL.DEFAULT_THRESHOLDS) >= 3     # CPython's defaults
    assert _full_collections_while_a_group_reads(THRESHOLDS) == 0


def test_the_watch_counts_each_collection_and_its_pause(restore_gc):
    watch = GcWatch()
    watch.install((5000, 7, 9))
    try:
        assert gc.get_threshold() == (5000, 7, 9)
        gc.collect(2)
        gc.collect(0)
    finally:
        watch.uninstall()
    assert watch.collections[2] >= 1 and watch.collections[0] >= 1
    assert watch.max_pause_s[2] > 0 and watch.pause_s[2] >= watch.max_pause_s[2]
    counted = list(watch.collections)
    gc.collect(2)                                   # uninstalled: no longer counted
    assert watch.collections == counted
    fields = dict(watch.info_fields())
    assert [fields["gc_gen%d_threshold" % g] for g in range(3)] == [5000, 7, 9] and fields["gc_gen2_collections"] == counted[2]
    assert fields["gc_enabled"] == 1


def test_install_is_idempotent(restore_gc):
    watch = GcWatch()
    watch.install()
    watch.install()
    try:
        assert gc.get_threshold() == THRESHOLDS
        assert gc.callbacks.count(watch._on_gc) == 1
    finally:
        watch.uninstall()
    assert watch._on_gc not in gc.callbacks
    assert gc_policy.WATCH is not watch
