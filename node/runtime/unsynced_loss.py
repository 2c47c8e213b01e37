"""TEST-ONLY fault: make a crash lose exactly the WAL bytes that were never fsynced.

A kill -9 of a process loses nothing it wrote: the bytes sit in the page cache and
the kernel writes them later. A power cut loses whatever was not fdatasynced. This
machine has neither device-mapper (dm-flakey / dm-log-writes) nor FUSE, and dropping
the page cache does not drop dirty pages, so the loss is emulated in the writer.

Enabled only by the environment variable XRAFT_UNSYNCED_LOSS=<marker path> (the
namespace harness sets it for its nodes, ops/netns_hosts.py; nothing else may). With
it, the WAL (runtime/wal.py) keeps an undo journal for each file it writes, in the
directory `<marker>.undo/` (beside the marker, off the node's data filesystem, so an
ENOSPC fault there never fails the journal), named by a hash of the file's path:

    | "S" | size u64 | path len u16 | path |       the file's size at its last fdatasync
    | "B" | offset u64 | len u32 | len bytes |      what a write or truncation is about to replace

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

import hashlib
import os
import struct
from typing import Optional

ENV = "XRAFT_UNSYNCED_LOSS"
SUFFIX = ".unsynced-undo"
_SIZE = struct.Struct(">cQH")
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


def _abs(path: str) -> str:
    return os.path.realpath(path)


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
        self.dir = marker + ".undo"

    def journal_of(self, path: str) -> str:
        return os.path.join(self.dir, hashlib.sha256(_abs(path).encode()).hexdigest()[:40] + SUFFIX)

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
        self.removed(_path_of(fd))

    def renamed(self, src: str, dst: str) -> None:
        """The journal of src now undoes dst (its first record names the file)."""
        try:
            size, changes = read_journal(self.journal_of(src))
        except FileNotFoundError:
            return
        self._write_new(dst, size, changes)
        self.removed(src)

    def removed(self, path: str) -> None:
        try:
            os.unlink(self.journal_of(path))
        except FileNotFoundError:
            pass

    def _start(self, fd: int) -> int:
        """The file's current size; opens its journal with the synced size if it has none."""
        size = os.fstat(fd).st_size
        path = _path_of(fd)
        if not os.path.exists(self.journal_of(path)):
            self._write_new(path, size, [])
        return size

    def _write_new(self, path: str, size: int, changes: list) -> None:
        """A journal made whole under a temporary name: it never lacks its "S" record."""
        os.makedirs(self.dir, exist_ok=True)
        journal = self.journal_of(path)
        name = _abs(path).encode()
        with open(journal + ".new", "wb") as f:
            f.write(_SIZE.pack(b"S", size, len(name)) + name)
            for offset, old in changes:
                f.write(_BYTES.pack(b"B", offset, len(old)) + old)
        os.replace(journal + ".new", journal)

    def _append(self, fd: int, offset: int, old: bytes) -> None:
        journal = self.journal_of(_path_of(fd))
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
        if not os.path.isdir(self.dir):
            return done
        mine = _abs(dirpath)
        for name in sorted(os.listdir(self.dir)):
            journal = os.path.join(self.dir, name)
            if name.endswith(SUFFIX + ".new"):
                os.unlink(journal)                          # a journal never started
                continue
            target = journal_target(journal)
            if os.path.dirname(target) != mine:
                continue                                    # another WAL directory's
            if lose and os.path.exists(target):
                done.append(roll_back(target, journal))
            os.unlink(journal)
        return done


def journal_target(journal: str) -> str:
    """The path of the file a journal undoes (its first record)."""
    with open(journal, "rb") as f:
        head = f.read(_SIZE.size)
        if len(head) < _SIZE.size or head[:1] != b"S":
            raise UndoJournalError(f"{journal}: no synced-size record")
        return f.read(_SIZE.unpack(head)[2]).decode()


def read_journal(journal: str) -> tuple:
    """(synced size, [(offset, old bytes)] in write order); a torn last record is dropped."""
    if os.path.getsize(journal) > MAX_JOURNAL_BYTES:
        raise UndoJournalError(f"{journal}: over {MAX_JOURNAL_BYTES} bytes")
    with open(journal, "rb") as f:
        data = f.read()
    if len(data) < _SIZE.size or data[:1] != b"S":
        raise UndoJournalError(f"{journal}: no synced-size record")
    _, size, name_len = _SIZE.unpack_from(data, 0)
    pos, changes = _SIZE.size + name_len, []
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
