"""A group's snapshots (GroupDriver's part, docs/architecture.md "Snapshots"): when one is
due, and how it is made — by a forked child (snapshot_child.py) while the group goes on, then
published by a short storage job at the next pump; or in process, as one storage job.

A mixin of GroupDriver (raft_driver.py): it uses the driver's options, stats, storage, state
machine, host, applied index and snapshot index, and the fields it sets in __init__:
_bytes_since_snap, _child_images, _child_failures_in_row, _image_task, _image, _image_done.
"""
from __future__ import annotations

import logging
import os
import threading

from ..invariant import invariant
from ..raft.types import Snapshot, SnapshotOutOfDate
from . import snapshot_child

log = logging.getLogger("xraft.driver")

MAX_CHILD_FAILURES = 3  # snapshot children failing in a row (a full disk, a crash) before images are made in process
# The entry-count trigger also waits for log bytes >= 1/SNAPSHOT_LOG_RATIO of the last image
# (redis' auto-aof-rewrite-percentage, the other way round), up to SNAPSHOT_ENTRIES_CAP times
# snapshot_entries: without it, small records (XACKs) of a large state made one O(state) image
# per snapshot_entries records, so the imaging work per write grew with the state (issue 14:
# XACK at 1M pending 0.28-0.38x of 1k pending, three replicas' children on two cores).
SNAPSHOT_LOG_RATIO = 16
SNAPSHOT_ENTRIES_CAP = 16


class Snapshots:
    def _snapshot_due(self) -> bool:
        # The byte budget is at least the last image's size: however large the state grows,
        # writing images costs about one byte per byte logged, and a restart reads at most
        # about twice the state (image + log).
        o = self.options
        entries = self.applied - self.snap_index
        if entries >= o.snapshot_entries and (
                self._bytes_since_snap * SNAPSHOT_LOG_RATIO >= self.stats.last_snapshot_bytes
                or entries >= SNAPSHOT_ENTRIES_CAP * o.snapshot_entries):
            return True
        return self._bytes_since_snap >= max(o.snapshot_bytes, self.stats.last_snapshot_bytes)

    def _maybe_snapshot(self, job_ending: bool = False) -> bool:
        """Start a snapshot if one is due (loop thread, the storage not in a job: none runs, or
        `job_ending`: the one that ran has finished). True if a storage job started (busy).

        In a forked child when possible: the image is made at `applied` as of now while the
        group goes on, and only publishing the written file is a storage job (pump()).
        Else in process: image, file and compaction as one storage job, the loop stopped
        for the image (the fallback where fork is missing or a child failed)."""
        if self._image_task is not None or self._image_done is not None or not self._snapshot_due():
            return False
        index, cs = self.applied, self.conf_state
        if index <= self.snap_index:
            return False  # a snapshot installed from the leader already covers it
        self._bytes_since_snap = 0
        if not self._child_images:
            self._start(self._make_snapshot(index, cs, self.sm.snapshot()))
            return True
        plan = self.storage.plan_snapshot(index, cs)
        tmp = plan.files.tmp_path(plan.meta.index, plan.meta.term)
        image = snapshot_child.ChildImage(self.sm.snapshot, plan.write, tmp)
        try:
            # Fork HERE, synchronously: the machine is at `index` now. (A fork in the task, one
            # loop iteration later, imaged entries applied since under this index's name, and
            # a restart from it applied them twice: the crash loop's invariant caught it.)
            image.start()
        except snapshot_child.SnapshotChildError as exc:
            self._child_failed(plan, exc)
            return False
        self._image = image
        self._image_task = self.host.loop.create_task(self._make_image(plan, image))
        return False

    def _child_failed(self, plan, exc: BaseException) -> None:
        self.stats.snapshot_child_failures += 1
        self._child_failures_in_row += 1
        if self._child_failures_in_row >= MAX_CHILD_FAILURES:
            self._child_images = False
        log.warning("group %d node %d: snapshot at %d not made (%s)%s", self.group_id, self.node_id,
                    plan.meta.index, exc, "; making images in process from now on"
                    if not self._child_images else "; trying again later")
        self._bytes_since_snap = max(self._bytes_since_snap, self.options.snapshot_bytes)

    async def _make_image(self, plan, image) -> None:
        """The child (forked at plan.meta.index) images the state and writes the plan's file;
        then the next pump() adopts it (_adopt_image)."""
        tmp = image.tmp
        try:
            n = await image.wait()
        except snapshot_child.SnapshotChildError as exc:
            self._child_failed(plan, exc)
            return
        finally:
            self._image_task = self._image = None
        if self.closed or self.failed is not None:
            _unlink_quietly(tmp)
            return
        self.stats.snapshots_in_child += 1
        self._child_failures_in_row = 0
        self._image_done = (plan, tmp, n)
        self.host.mark_dirty(self)
        self._run_host()

    async def _adopt_image(self, plan, tmp: str, n: int) -> None:
        keep = self.options.snapshot_keep_entries
        try:
            await self.host.loop.run_in_executor(self.host.executor, self.storage.adopt_snapshot,
                                                 plan, tmp, n, keep)
        except SnapshotOutOfDate:
            return  # a snapshot installed from the leader while the child worked is newer
        self._snapshot_made(plan.meta.index, n)

    async def _make_snapshot(self, index: int, cs, data: bytes) -> None:
        """State machine image at `index` -> snapshot file -> compact the log (executor)."""
        keep = self.options.snapshot_keep_entries
        await self.host.loop.run_in_executor(self.host.executor, self.storage.create_snapshot,
                                             index, cs, data, keep)
        self._snapshot_made(index, len(data))

    def _snapshot_made(self, index: int, n: int) -> None:
        self.snap_index = max(self.snap_index, index)
        self.stats.snapshots_created += 1
        self.stats.snapshot_bytes_created += n
        self.stats.last_snapshot_bytes = n

    def _persist_snapshot(self, snap: Snapshot) -> None:
        """Executor thread (_persist): an installed snapshot's file written and fsynced
        (storage.apply_snapshot) while a second thread decodes it (_prepare_restore). The two
        overlap: the write, its CRC and the fsync release the GIL, and they were a third of a
        catch-up's time after the last chunk (bench/catchup.py, bench/README.md session 12).
        The order of durable writes is unchanged, and the decode touches nothing: _install()
        swaps the decoded state in on the loop only after _persist returns."""
        decode = threading.Thread(target=self._prepare_restore, args=(snap.data,),
                                  name=f"xraft-restore-{self.group_id}", daemon=True)
        decode.start()
        try:
            self.storage.apply_snapshot(snap)
        except BaseException:
            decode.join()
            self._restore_prepared = None  # not installed: drop the decoded image now
            raise
        decode.join()

    def _prepare_restore(self, data: bytes) -> None:
        """Executor thread: decode a snapshot to install, so that _install() on the loop only
        swaps it in (a 400 MiB image decodes for seconds: every group of this node would
        wait). A failure here is left to restore(), which decodes again and reports it."""
        self._restore_prepared = None
        prep = getattr(self.sm, "prepare_restore", None)
        if prep is not None:
            try:
                self._restore_prepared = (data, prep(data))
            except Exception:
                pass

    def _install(self, snap: Snapshot) -> None:
        idx = snap.metadata.index
        invariant(idx > self.applied, f"snapshot at {idx} not past applied {self.applied}")
        prepared, self._restore_prepared = self._restore_prepared, None
        if prepared is not None and prepared[0] is snap.data:
            self.sm.restore(snap.data, idx, prepared[1])
            self.stats.snapshot_restores_prepared += 1
        else:
            self.sm.restore(snap.data, idx)
        invariant(self.sm.applied_index == idx, "state machine restored to the snapshot index")
        self.applied = self.snap_index = idx
        self._bytes_since_snap = 0
        self.conf_state = snap.metadata.conf_state
        self.stats.snapshots_installed += 1
        self.stats.last_snapshot_bytes = len(snap.data)
        if self._pending:  # a leader never installs a snapshot; a stale proposal cannot stay
            self._fail_pending("replaced by an installed snapshot")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
