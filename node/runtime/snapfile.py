"""Snapshot files: one Raft snapshot per file, written atomically, verified on load.

Directory
    <dir>/snap-<index:016x>-<term:016x>.snap   complete snapshots (name = metadata)
    <dir>/*.snap.tmp                            interrupted writes; deleted at open

File layout (big-endian)
    +----------+---------+-------+----------+----------------+----------+-----------+--------+
    | magic    | version | flags | meta_len | metadata       | data_len | data      | crc32c |
    | 8 bytes  |  u16    |  u16  |   u32    | meta_len bytes |   u64    | data_len  |  u32   |
    +----------+---------+-------+----------+----------------+----------+-----------+--------+
    magic = b"XRFTSNAP"; version = 1; flags = 0;
    metadata = codec.encode_snapshot_metadata (index, term, conf state), meta_len <= MAX_META_BYTES;
    data_len <= codec.MAX_SNAPSHOT_DATA_BYTES; the file is exactly 16 + meta_len + 8 + data_len + 4
    bytes;
    crc32c covers every byte before it; the name's index/term equal the metadata's.

Atomicity: write `<name>.tmp`, fsync it, rename to `<name>`, fsync the
directory. A crash leaves either no file or a complete one (a .tmp is never
read). Like etcd's snapshotter, a damaged snapshot is skipped in favour of the
next older valid one, and the caller decides whether the log still connects.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
from dataclasses import dataclass
from typing import Optional

import crc32c

from ..invariant import invariant
from ..raft.codec import MAX_SNAPSHOT_DATA_BYTES, CodecError, decode_snapshot_metadata, \
    encode_snapshot_metadata
from ..raft.types import EMPTY_SNAPSHOT, Snapshot
from .wal import fsync_dir, make_dir_durable

log = logging.getLogger("xraft.snapfile")

SNAP_MAGIC = b"XRFTSNAP"
SNAP_VERSION = 1
SNAP_HEADER = struct.Struct(">8sHHI")  # magic, version, flags, meta_len
SNAP_HEADER_BYTES = SNAP_HEADER.size  # 16
DATA_LEN = struct.Struct(">Q")
CRC = struct.Struct(">I")
# A ConfState at its codec limits (4 x 4096 + 65536 IDs of 8 bytes) is ~650 KiB.
MAX_META_BYTES = 1 << 20
MAX_SNAPSHOT_FILE_BYTES = SNAP_HEADER_BYTES + MAX_META_BYTES + DATA_LEN.size + \
    MAX_SNAPSHOT_DATA_BYTES + CRC.size
DEFAULT_KEEP = 2
_READ_CHUNK = 4 << 20

_SNAP_NAME = re.compile(r"^snap-([0-9a-f]{16})-([0-9a-f]{16})\.snap$")


class SnapshotFileError(Exception):
    """A snapshot file that cannot be used: where (path, byte offset) and why."""

    def __init__(self, reason: str, path: str, offset: int = -1):
        super().__init__(f"snapshot file {path} at byte {offset}: {reason}")
        self.reason = reason
        self.path = path
        self.offset = offset


@dataclass(frozen=True)
class SnapshotFileInfo:
    index: int  # from the file name; verified against the metadata on load
    term: int
    path: str


def snapshot_name(index: int, term: int) -> str:
    return f"snap-{index:016x}-{term:016x}.snap"


def snapshot_file_parts(snap: Snapshot) -> list:
    """The file's bytes as parts, in order: header + metadata + length, the data (not copied),
    the CRC. Written one after the other: joining them copied the whole image (up to 1 GiB)
    once more, in a second buffer as large, before the write (issue 14's catch-up)."""
    meta = encode_snapshot_metadata(snap.metadata)
    invariant(len(meta) <= MAX_META_BYTES, f"snapshot metadata {len(meta)} bytes within limit")
    if len(snap.data) > MAX_SNAPSHOT_DATA_BYTES:
        raise ValueError(f"snapshot data {len(snap.data)} bytes over {MAX_SNAPSHOT_DATA_BYTES}")
    head = b"".join((SNAP_HEADER.pack(SNAP_MAGIC, SNAP_VERSION, 0, len(meta)), meta,
                     DATA_LEN.pack(len(snap.data))))
    crc = crc32c.crc32c(snap.data, crc32c.crc32c(head))
    return [head, snap.data, CRC.pack(crc)]


def encode_snapshot_file(snap: Snapshot) -> bytes:
    return b"".join(snapshot_file_parts(snap))


def read_snapshot_file(path: str) -> Snapshot:
    """Load and fully verify one snapshot file (SnapshotFileError if anything is off)."""
    snap = open_snapshot_file(path)
    return Snapshot(snap.metadata, snap.data.read_all())


class FileSnapshotData:
    """A snapshot file's data, read when sliced: what a leader sends a follower a chunk at a
    time (raft/snapshot_send.py) without reading a whole image (up to 1 GiB) on the loop.

    The frame (magic, version, metadata, length) is checked when opened; the CRC as the data
    is read: in order, the slices extend a running CRC, and the slice that reaches the end is
    returned only if the whole file's CRC matches (else SnapshotFileError: a damaged file is
    never sent whole). The file stays open, so a snapshot pruned meanwhile still reads.
    `read_all()` reads and verifies everything (a restore)."""

    __slots__ = ("path", "_fd", "_off", "_len", "_crc", "_crc_pos", "_want_crc")

    def __init__(self, path: str, fd: int, data_off: int, data_len: int, prefix_crc: int, want_crc: int):
        self.path = path
        self._fd = fd  # owned: closed with this object
        self._off = data_off  # file offset of the data's first byte
        self._len = data_len  # Invariant: <= MAX_SNAPSHOT_DATA_BYTES
        self._crc = prefix_crc  # crc32c of the file up to data byte _crc_pos
        self._crc_pos = 0  # Invariant: 0 <= _crc_pos <= _len
        self._want_crc = want_crc  # the file's stored CRC

    def __len__(self) -> int:
        return self._len

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def _pread(self, start: int, stop: int) -> bytes:
        out = os.pread(self._fd, stop - start, self._off + start)
        if len(out) != stop - start:
            raise SnapshotFileError("file shrank while read", self.path, self._off + start + len(out))
        return out

    def __getitem__(self, key) -> bytes:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("FileSnapshotData takes contiguous slices only")
        start, stop, _ = key.indices(self._len)
        if stop <= start:
            return b""
        while self._crc_pos < start:  # a slice past the checked prefix: check the gap first
            end = min(start, self._crc_pos + _READ_CHUNK)
            self._crc = crc32c.crc32c(self._pread(self._crc_pos, end), value=self._crc)
            self._crc_pos = end
        data = self._pread(start, stop)
        if stop > self._crc_pos:
            self._crc = crc32c.crc32c(memoryview(data)[self._crc_pos - start:], value=self._crc)
            self._crc_pos = stop
            if stop == self._len and self._crc != self._want_crc:
                raise SnapshotFileError("CRC mismatch", self.path, self._off + self._len)
        return data

    def read_all(self) -> bytes:
        parts = [self[i:i + _READ_CHUNK] for i in range(0, self._len, _READ_CHUNK)]
        if self._len == 0 and self._crc != self._want_crc:
            raise SnapshotFileError("CRC mismatch", self.path, self._off)
        return b"".join(parts)


def open_snapshot_file(path: str) -> Snapshot:
    """A snapshot file with its data as a FileSnapshotData (read and CRC-checked when sliced);
    the frame and metadata are verified now (SnapshotFileError)."""
    m = _SNAP_NAME.match(os.path.basename(path))
    if not m:
        raise SnapshotFileError("not a snapshot file name", path, 0)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        fixed = SNAP_HEADER_BYTES + DATA_LEN.size + CRC.size
        if not fixed <= size <= MAX_SNAPSHOT_FILE_BYTES:
            raise SnapshotFileError(f"{size} bytes is outside the frame's limits", path, 0)
        head = os.pread(fd, SNAP_HEADER_BYTES, 0)
        magic, version, flags, meta_len = SNAP_HEADER.unpack(head)
        if magic != SNAP_MAGIC:
            raise SnapshotFileError(f"bad magic {magic!r}", path, 0)
        if version != SNAP_VERSION or flags != 0:
            raise SnapshotFileError(f"unsupported version {version} / flags {flags:#x}", path, 8)
        if meta_len > MAX_META_BYTES or meta_len > size - fixed:
            raise SnapshotFileError(f"metadata length {meta_len} invalid", path, 12)
        meta = os.pread(fd, meta_len, SNAP_HEADER_BYTES)
        data_len_bytes = os.pread(fd, DATA_LEN.size, SNAP_HEADER_BYTES + meta_len)
        (data_len,) = DATA_LEN.unpack(data_len_bytes)
        if data_len > MAX_SNAPSHOT_DATA_BYTES or size != fixed + meta_len + data_len:
            raise SnapshotFileError(f"data length {data_len} does not match file size {size}",
                                    path, SNAP_HEADER_BYTES + meta_len)
        (want,) = CRC.unpack(os.pread(fd, CRC.size, size - CRC.size))
        try:
            meta_value = decode_snapshot_metadata(meta)
        except CodecError as exc:
            raise SnapshotFileError(f"metadata: {exc}", path, SNAP_HEADER_BYTES) from None
        if (meta_value.index, meta_value.term) != (int(m.group(1), 16), int(m.group(2), 16)):
            raise SnapshotFileError(f"metadata ({meta_value.index}, {meta_value.term}) does not match "
                                    "the file name", path, SNAP_HEADER_BYTES)
        prefix = crc32c.crc32c(data_len_bytes, value=crc32c.crc32c(meta, value=crc32c.crc32c(head)))
        data = FileSnapshotData(path, fd, SNAP_HEADER_BYTES + meta_len + DATA_LEN.size, data_len, prefix, want)
    except BaseException:
        os.close(fd)
        raise
    return Snapshot(meta_value, data)


def snapshot_bytes(snap: Snapshot) -> bytes:
    """`snap`'s data as bytes: read (and verified) when it is a FileSnapshotData."""
    data = snap.data
    return data.read_all() if isinstance(data, FileSnapshotData) else data


class SnapshotFiles:
    """The snapshot directory: save atomically, load the newest valid, prune old ones."""

    def __init__(self, dirpath: str, keep: int = DEFAULT_KEEP, durable: bool = True):
        if keep < 1:
            raise ValueError(f"keep {keep} must be >= 1")
        self.dir = dirpath
        self.keep = keep  # number of newest snapshot files kept by prune()
        self.durable = durable  # False: no fsyncs (fsync policy "never")
        make_dir_durable(dirpath, durable)
        for name in os.listdir(dirpath):
            if name.endswith(".snap.tmp"):
                # never renamed, so never a snapshot; a snapshot child still writing may rename
                # it between the listing and the unlink (a reader opening a live node's dir)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
        self.skipped: list[SnapshotFileError] = []  # damaged files passed over by load_newest()

    def list(self) -> list[SnapshotFileInfo]:
        """Snapshot files by name, oldest first (names are not trusted until loaded)."""
        out = []
        for name in os.listdir(self.dir):
            m = _SNAP_NAME.match(name)
            if m:
                out.append(SnapshotFileInfo(int(m.group(1), 16), int(m.group(2), 16),
                                            os.path.join(self.dir, name)))
        out.sort(key=lambda i: (i.index, i.term))
        return out

    def save(self, snap: Snapshot) -> str:
        """Write `snap` atomically (durably unless durable=False); then prune. Returns the path."""
        return self.publish(self.write_tmp(snap))

    def write_tmp(self, snap: Snapshot) -> str:
        """The first half of save(): `snap` written to its `.tmp` and fsynced. Returns the .tmp
        path (a forked snapshot child calls this; the node then publishes it)."""
        invariant(not snap.is_empty(), "saving an empty snapshot")
        tmp = self.tmp_path(snap.metadata.index, snap.metadata.term)
        parts = snapshot_file_parts(snap)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view):]
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def tmp_path(self, index: int, term: int) -> str:
        return os.path.join(self.dir, snapshot_name(index, term)) + ".tmp"

    def publish(self, tmp: str) -> str:
        """The second half of save(): rename a written .tmp to its snapshot name, make the
        rename durable, prune. Returns the snapshot's path."""
        invariant(tmp.endswith(".snap.tmp") and os.path.dirname(tmp) == self.dir, "a .tmp of this directory")
        path = tmp[:-len(".tmp")]
        os.rename(tmp, path)
        if self.durable:
            fsync_dir(self.dir)
        self.prune()
        return path

    def load_newest(self) -> Snapshot:
        """The newest snapshot that verifies; EMPTY_SNAPSHOT if none. Damaged ones are skipped."""
        self.skipped = []
        for info in reversed(self.list()):
            try:
                return read_snapshot_file(info.path)
            except SnapshotFileError as exc:
                log.warning("skipping damaged snapshot: %s", exc)
                self.skipped.append(exc)
        return EMPTY_SNAPSHOT

    def newest_info(self) -> Optional[SnapshotFileInfo]:
        files = self.list()
        return files[-1] if files else None

    def prune(self) -> list[str]:
        """Delete all but the `keep` newest snapshot files; returns deleted paths."""
        files = self.list()
        doomed = [i.path for i in files[:-self.keep]]
        for p in doomed:
            os.unlink(p)
        if doomed and self.durable:
            fsync_dir(self.dir)
        return doomed
