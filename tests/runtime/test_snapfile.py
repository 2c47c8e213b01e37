"""Snapshot files on real disks: round trip, every-byte damage detection, fallback, pruning."""
import os

import pytest

from xraft.node.raft.types import EMPTY_SNAPSHOT, ConfState, Snapshot, SnapshotMetadata
from xraft.node.runtime.snapfile import (
    SnapshotFileError,
    SnapshotFiles,
    encode_snapshot_file,
    open_snapshot_file,
    read_snapshot_file,
    snapshot_bytes,
    snapshot_name,
)


def snap(index, term=3, data=None):
    cs = ConfState(voters=(1, 2, 3), learners=(7,), removed=(9,))
    return Snapshot(SnapshotMetadata(index=index, term=term, conf_state=cs),
                    data if data is not None else b"state@%d" % index * 5)


def test_round_trip_is_atomic_and_named_by_metadata(tmp_path):
    files = SnapshotFiles(str(tmp_path))
    assert files.load_newest() == EMPTY_SNAPSHOT
    path = files.save(snap(10))
    assert os.path.basename(path) == snapshot_name(10, 3)
    assert os.listdir(tmp_path) == [snapshot_name(10, 3)]  # no .tmp left behind
    assert read_snapshot_file(path) == snap(10)
    assert SnapshotFiles(str(tmp_path)).load_newest() == snap(10)
    big = snap(11, data=os.urandom(9 << 20))  # several read chunks
    files.save(big)
    assert files.load_newest() == big


def test_keeps_newest_n(tmp_path):
    files = SnapshotFiles(str(tmp_path), keep=2)
    for i in (5, 9, 12, 20):
        files.save(snap(i))
    assert [i.index for i in files.list()] == [12, 20]
    with pytest.raises(ValueError):
        SnapshotFiles(str(tmp_path), keep=0)


def test_every_damaged_byte_is_detected_and_skipped(tmp_path):
    files = SnapshotFiles(str(tmp_path), keep=2)
    files.save(snap(4))
    path = files.save(snap(8, data=b"abc"))
    pristine = open(path, "rb").read()
    for byte in range(len(pristine)):
        damaged = bytearray(pristine)
        damaged[byte] ^= 1 << (byte % 8)
        with open(path, "wb") as f:
            f.write(damaged)
        with pytest.raises(SnapshotFileError) as info:
            read_snapshot_file(path)
        assert info.value.path == path
        assert files.load_newest() == snap(4)  # falls back to the older valid one
        assert [e.path for e in files.skipped] == [path]


def test_truncated_extended_and_misnamed_files(tmp_path):
    files = SnapshotFiles(str(tmp_path))
    path = files.save(snap(6))
    pristine = open(path, "rb").read()
    for cut in (0, 5, 16, len(pristine) // 2, len(pristine) - 1):
        with open(path, "wb") as f:
            f.write(pristine[:cut])
        with pytest.raises(SnapshotFileError):
            read_snapshot_file(path)
    with open(path, "wb") as f:
        f.write(pristine + b"\0")
    with pytest.raises(SnapshotFileError):
        read_snapshot_file(path)
    os.unlink(path)
    wrong = os.path.join(str(tmp_path), snapshot_name(7, 3))
    with open(wrong, "wb") as f:
        f.write(pristine)
    with pytest.raises(SnapshotFileError, match="does not match the file name"):
        read_snapshot_file(wrong)


def test_oversized_lengths_are_rejected_before_reading(tmp_path):
    good = encode_snapshot_file(snap(3))
    path = os.path.join(str(tmp_path), snapshot_name(3, 3))
    meta_huge = good[:12] + (2**32 - 1).to_bytes(4, "big") + good[16:]
    with open(path, "wb") as f:
        f.write(meta_huge)
    with pytest.raises(SnapshotFileError, match="metadata length"):
        read_snapshot_file(path)


def test_interrupted_write_leftover_is_removed(tmp_path):
    (tmp_path / (snapshot_name(9, 1) + ".tmp")).write_bytes(b"partial")
    files = SnapshotFiles(str(tmp_path))
    assert os.listdir(tmp_path) == []
    assert files.load_newest() == EMPTY_SNAPSHOT


def test_a_file_view_reads_slices_and_checks_the_crc_at_the_end(tmp_path):
    """What a leader sends from (open_snapshot_file): chunks read when sliced, in any order
    and again after a rewind, equal to the bytes; the whole file's CRC decides the last one."""
    data = os.urandom((3 << 20) + 12345)
    path = SnapshotFiles(str(tmp_path)).save(snap(40, data=data))
    view = open_snapshot_file(path)
    assert view.metadata == snap(40).metadata and len(view.data) == len(data)
    step = 1 << 20
    assert view.data[2 * step:3 * step] == data[2 * step:3 * step]   # past the checked prefix
    assert view.data[0:step] == data[0:step]                           # a rewind
    assert view.data[3 * step:len(data) + 99] == data[3 * step:]        # the end: CRC checked
    assert snapshot_bytes(view) == data == snapshot_bytes(snap(40, data=data))
    os.unlink(path)                                                    # pruned meanwhile: still reads
    assert view.data[5:10] == data[5:10]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_file_view_refuses_the_last_chunk_of_a_damaged_file(tmp_path, where):
    data = os.urandom(1 << 20)
    path = SnapshotFiles(str(tmp_path)).save(snap(41, data=data))
    view = open_snapshot_file(path)
    data_off = os.path.getsize(path) - 4 - len(data)
    pos = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    with open(path, "r+b") as f:
        f.seek(data_off + pos)
        f.write(bytes([data[pos] ^ 0x40]))
    step = 64 << 10
    chunks = [view.data[i:i + step] for i in range(0, len(data) - step, step)]  # all but the last
    assert len(chunks) == len(data) // step - 1
    with pytest.raises(SnapshotFileError, match="CRC"):
        view.data[len(data) - step:len(data)]
    with pytest.raises(SnapshotFileError, match="CRC"):
        snapshot_bytes(open_snapshot_file(path))
