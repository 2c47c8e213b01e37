"""TEST-ONLY fault: make a crash lose exactly the WAL bytes that were never fsynced.

A kill -9 of a process loses nothing it wrote: the bytes sit in the page cache and
the kernel writes them later. A power cut loses whatever was not fdatasynced. This
machine has neither device-mapper (dm-flakey / dm-log-writes) nor FUSE, and dropping
the page cache does not drop dirty pages, so the loss is emulated in the writer.

Enabled only by the environment variable XRAFT_UNSYNCED_LOSS=<marker path> (the
namespace harness sets it for its nodes, ops/netns_hosts.py; nothing else may). With
it, the WAL (runtime/wal.py) keeps an undo journal beside each file it writes, in
`<file>.unsynced-undo`:

    | "S" | size u64 |                           the file's size at its last fdatasync
    | "B" | offset u64 | len u32 | len bytes |   what a write or truncation is about to replace

A record is appended (plain write, no fsync: a process kill keeps it, and a power
cut of the machine itself is not what this emulates) *before* the change it undoes,
so a journal never misses a change that landed; a torn last record belongs to a
change that never happened and is ignored. fdatasync of the file deletes its
journal (everything written is synced); a rename moves it along.

When the WAL next opens its directory (the node restarted): if the marker file
exists, the crash was a "power cut" of this node (the nemesis wrote the marker
before its SIGKILL): every journal is applied, newest record first, then the file is
cut to its synced size, so the files hold exactly what was fsynced. Without the
marker the crash was of the process alone and the journals are dropped. The
harness removes the marker once the node is back up.

Covered: the WAL's segment files (the log, hard state, compaction records), which
hold everything acknowledged. Not covered: snapshot files, the incarnation file and
directory entries (each is written to a .tmp, fsynced and renamed; under
--fsync never the WAL itself skips those fsyncs, and a real power cut could also
lose a snapshot or a new segment's name).
"""
from __future__ import annotations

import os
import struct
from typing import Optional

ENV = "XRAFT_UNSYNCED_LOSS"
SUFFIX = ".unsynced-undo"
_SIZE = struct.Struct(">cQ")
_BYTES = struct.Struct(">cQI")
# One change's undo is at most what it replaces; a WAL write is bounded by its batch
# (MAX_PENDING_BYTES + zero-ahead), so this only guards against a runaway journal.
MAX_JOURNAL_BYTES = 1 << 30


class UndoJournalError(OSError):
    """A journal that cannot be applied (not this format, or over its bound)."""


def from_env() -> Optional["UnsyncedLoss"]:
    marker = os.environ.get(ENV)
    return UnsyncedLoss(marker) if marker else None


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _read_at(fd: int, offset: int, n: int) -> bytes:
    """n bytes at offset of fd's file (the writer's fd may be write-only)."""
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        return os.pread(rfd, n, offset)
    finally:
        os.close(rfd)


class UnsyncedLoss:
    """The journal keeper for one process (see the module doc)."""

    def __init__(self, marker: str):
        self.marker = marker

    # -- the writer's hooks ---------------------------------------------------------
    def before_write(self, fd: int, offset: int, length: int) -> None:
        """Journal what a write of `length` bytes at `offset` replaces (and the synced size)."""
        size = self._start(fd)
        if offset < size and length:
            self._append(fd, offset, _read_at(fd, offset, min(length, size - offset)))

    def before_truncate(self, fd: int, new_size: int) -> None:
        size = self._start(fd)
        if new_size < size:
            self._append(fd, new_size, _read_at(fd, new_size, size - new_size))

    def synced(self, fd: int) -> None:
        """fdatasync(fd) returned: nothing of the file is unsynced any more."""
        try:
            os.unlink(_path_of(fd) + SUFFIX)
        except FileNotFoundError:
            pass

    def renamed(self, src: str, dst: str) -> None:
        try:
            os.replace(src + SUFFIX, dst + SUFFIX)
        except FileNotFoundError:
            pass

    def removed(self, path: str) -> None:
        try:
            os.unlink(path + SUFFIX)
        except FileNotFoundError:
            pass

    def _start(self, fd: int) -> int:
        """The file's current size; opens its journal with the synced size if it has none."""
        size = os.fstat(fd).st_size
        journal = _path_of(fd) + SUFFIX
        if not os.path.exists(journal):
            # Made whole under a temporary name: a journal never lacks its "S" record.
            tmp = journal + ".new"
            with open(tmp, "wb") as f:
                f.write(_SIZE.pack(b"S", size))
            os.replace(tmp, journal)
        return size

    def _append(self, fd: int, offset: int, old: bytes) -> None:
        journal = _path_of(fd) + SUFFIX
        if os.path.getsize(journal) + _BYTES.size + len(old) > MAX_JOURNAL_BYTES:
            raise UndoJournalError(f"{journal}: undo journal over {MAX_JOURNAL_BYTES} bytes")
        with open(journal, "ab") as f:
            f.write(_BYTES.pack(b"B", offset, len(old)) + old)

    # -- at open ------------------------------------------------------------------------
    def recover(self, dirpath: str) -> list:
        """Roll every journaled file in `dirpath` back to its synced state when the marker
        exists, else drop the journals. Returns [(file, synced size, bytes restored)]."""
        lose = os.path.exists(self.marker)
        done = []
        for name in sorted(os.listdir(dirpath)):
            if name.endswith(SUFFIX + ".new"):
                os.unlink(os.path.join(dirpath, name))      # a journal never started
                continue
            if not name.endswith(SUFFIX):
                continue
            journal = os.path.join(dirpath, name)
            target = journal[:-len(SUFFIX)]
            if lose and os.path.exists(target):
                done.append(roll_back(target, journal))
            os.unlink(journal)
        return done


def read_journal(journal: str) -> tuple:
    """(synced size, [(offset, old bytes)] in write order); a torn last record is dropped."""
    if os.path.getsize(journal) > MAX_JOURNAL_BYTES:
        raise UndoJournalError(f"{journal}: over {MAX_JOURNAL_BYTES} bytes")
    with open(journal, "rb") as f:
        data = f.read()
    if len(data) < _SIZE.size or data[:1] != b"S":
        raise UndoJournalError(f"{journal}: no synced-size record")
    size = _SIZE.unpack_from(data, 0)[1]
    pos, changes = _SIZE.size, []
    while pos + _BYTES.size <= len(data):
        kind, offset, n = _BYTES.unpack_from(data, pos)
        if kind != b"B":
            raise UndoJournalError(f"{journal}: record kind {kind!r} at byte {pos}")
        if pos + _BYTES.size + n > len(data):
            break                                   # torn: its change never happened
        changes.append((offset, data[pos + _BYTES.size:pos + _BYTES.size + n]))
        pos += _BYTES.size + n
    return size, changes


def roll_back(target: str, journal: str) -> tuple:
    """Undo the journaled changes of `target`, newest first, and cut it to its synced size."""
    size, changes = read_journal(journal)
    fd = os.open(target, os.O_WRONLY)
    try:
        for offset, old in reversed(changes):
            os.pwrite(fd, old, offset)
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return target, size, sum(len(old) for _, old in changes)
