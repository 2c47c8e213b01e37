"""WAL record/segment layer on real files: framing, group commit, torn tails, corruption, rotation."""
import logging
import os
import shutil

import pytest

from xraft.node.runtime.wal import (
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    FsyncPolicy,
    RecordPos,
    RecordType,
    Wal,
    WalCorruption,
    WalLocked,
    WalOptions,
    WalRecordTooLarge,
    encode_record,
)


def open_wal(path, options=WalOptions(), segment_start=None):
    seen = []
    wal = Wal.open(str(path), options, visit=seen.append, segment_start=segment_start)
    return wal, [(r.type, r.payload) for r in seen], seen


def sample_records(n, size=40):
    types = [RecordType.ENTRIES, RecordType.HARD_STATE, RecordType.SNAPSHOT, RecordType.COMPACT]
    return [(types[i % 4], bytes((i * 7 + j) % 251 for j in range(size + i % 5))) for i in range(n)]


def write_records(path, records, options=WalOptions()):
    wal, _, _ = open_wal(path, options)
    positions = wal.append(records)
    assert wal.sync() is (options.fsync is not FsyncPolicy.NEVER)
    wal.close()
    return positions


def only_segment(path):
    segs = sorted(p for p in os.listdir(path) if p.endswith(".log"))
    assert len(segs) == 1
    return os.path.join(path, segs[0])


def test_round_trip_and_positions(tmp_path):
    recs = sample_records(20)
    positions = write_records(tmp_path / "w", recs)
    wal, got, seen = open_wal(tmp_path / "w")
    assert got == recs
    assert [RecordPos(r.seq, r.offset) for r in seen] == positions
    assert positions[0] == RecordPos(1, SEGMENT_HEADER_BYTES)
    for pos, rec in zip(positions, recs):
        assert wal.read_record(pos) == rec
    wal.close()


def test_append_only_buffers_until_sync(tmp_path):
    wal, _, _ = open_wal(tmp_path)
    seg = only_segment(tmp_path)
    before = os.path.getsize(seg)
    pos = wal.append(sample_records(5))
    assert os.path.getsize(seg) == before  # group commit: nothing written yet
    assert wal.read_record(pos[2]) == sample_records(5)[2]  # readable from the buffer
    assert wal.sync() is True
    assert os.path.getsize(seg) == before + sum(len(encode_record(t, p)) for t, p in sample_records(5))
    wal.close()


def test_fsync_never_is_not_durable_and_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="xraft.wal"):
        wal, _, _ = open_wal(tmp_path, WalOptions(fsync=FsyncPolicy.NEVER))
    assert "NOT durable" in caplog.text
    assert wal.durable is False
    wal.append(sample_records(3))
    assert wal.sync() is False
    wal.close()
    _, got, _ = open_wal(tmp_path)
    assert got == sample_records(3)


def test_fsync_batch_by_time_and_bytes(tmp_path):
    opts = WalOptions(fsync=FsyncPolicy.BATCH, batch_interval_ms=10, batch_bytes=10_000)
    wal, _, _ = open_wal(tmp_path, opts)
    assert wal.durable is False
    wal.append(sample_records(1))
    assert wal.sync(now_ms=1000) is True  # first sync always fsyncs (no previous fsync time)
    wal.append(sample_records(1))
    assert wal.sync(now_ms=1005) is False  # 5 ms later, few bytes: not due
    assert wal.sync(now_ms=1011) is True  # interval passed: fsync even with nothing new written
    wal.append([(RecordType.ENTRIES, bytes(12_000))])
    assert wal.sync(now_ms=1012) is True  # byte threshold reached
    wal.append(sample_records(1))
    assert wal.sync() is True  # no clock given: fsync now
    wal.close()


def test_limits(tmp_path):
    wal, _, _ = open_wal(tmp_path)
    with pytest.raises(WalRecordTooLarge):
        wal.append([(RecordType.ENTRIES, bytes(80 * 2**20 + 1))])
    with pytest.raises(ValueError):
        wal.append([(0, b"x")])
    with pytest.raises(ValueError):
        Wal.open(str(tmp_path / "other"), WalOptions(segment_bytes=100))
    wal.close()


def test_second_open_is_refused_while_locked(tmp_path):
    wal, _, _ = open_wal(tmp_path)
    with pytest.raises(WalLocked):
        Wal.open(str(tmp_path))
    wal.close()
    open_wal(tmp_path)[0].close()


def test_torn_tail_cut_at_every_byte_of_last_record(tmp_path):
    recs = sample_records(6)
    positions = write_records(tmp_path / "base", recs)
    seg_name = os.path.basename(only_segment(tmp_path / "base"))
    size = os.path.getsize(tmp_path / "base" / seg_name)
    last_off = positions[-1].offset
    for cut in range(last_off, size):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "base", d)
        os.truncate(d / seg_name, cut)
        wal, got, _ = open_wal(d)
        assert got == recs[:-1], cut
        if cut == last_off:
            assert wal.repaired is None  # a clean record boundary is not a repair
        else:
            assert wal.repaired.offset == last_off and wal.repaired.dropped_bytes == cut - last_off
        assert os.path.getsize(d / seg_name) == last_off
        # The WAL continues after the repair.
        wal.append([(RecordType.HARD_STATE, b"after repair")])
        wal.sync()
        wal.close()
        _, got, _ = open_wal(d)
        assert got == recs[:-1] + [(RecordType.HARD_STATE, b"after repair")]
        shutil.rmtree(d)


def test_crc_failing_last_record_and_zero_tail_are_torn(tmp_path):
    recs = sample_records(4)
    positions = write_records(tmp_path, recs)
    seg = only_segment(tmp_path)
    with open(seg, "r+b") as f:  # flip a payload bit of the last record
        f.seek(positions[-1].offset + RECORD_HEADER_BYTES + 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes((b[0] ^ 0x10,)))
    wal, got, _ = open_wal(tmp_path)
    assert got == recs[:-1] and wal.repaired.offset == positions[-1].offset
    wal.close()
    with open(seg, "ab") as f:  # a size extension whose blocks never landed: zeros
        f.write(bytes(5000))
    wal, got, _ = open_wal(tmp_path)
    assert got == recs[:-1] and wal.repaired.dropped_bytes == 5000
    wal.close()


def test_flipped_bit_in_any_non_tail_record_is_corruption(tmp_path):
    recs = sample_records(5, size=12)
    positions = write_records(tmp_path / "base", recs)
    seg_name = os.path.basename(only_segment(tmp_path / "base"))
    pristine = (tmp_path / "base" / seg_name).read_bytes()
    starts = [p.offset for p in positions]
    for byte in range(starts[0], starts[-1]):  # every byte of every record but the last
        owner = max(s for s in starts if s <= byte)
        damaged = bytearray(pristine)
        damaged[byte] ^= 1 << (byte % 8)
        (tmp_path / "base" / seg_name).write_bytes(bytes(damaged))
        with pytest.raises(WalCorruption) as info:
            open_wal(tmp_path / "base")
        assert info.value.offset == owner and info.value.path.endswith(seg_name), byte
        assert (tmp_path / "base" / seg_name).read_bytes() == bytes(damaged)  # never "repaired"


def test_damage_in_a_non_last_segment_is_corruption_even_at_its_end(tmp_path):
    opts = WalOptions(segment_bytes=4096)
    wal, _, _ = open_wal(tmp_path, opts)
    for _ in range(25):
        wal.append([(RecordType.ENTRIES, bytes(range(256)) * 2)])
        wal.sync()
    wal.close()
    segs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".log"))
    assert len(segs) >= 3
    first = tmp_path / segs[0]
    size = os.path.getsize(first)
    os.truncate(first, size - 1)  # "torn" but not the last segment
    with pytest.raises(WalCorruption) as info:
        open_wal(tmp_path, opts)
    assert info.value.path == str(first)


def test_segment_header_and_sequence_damage(tmp_path):
    opts = WalOptions(segment_bytes=4096)
    wal, _, _ = open_wal(tmp_path, opts)
    for _ in range(25):
        wal.append([(RecordType.ENTRIES, bytes(600))])
        wal.sync()
    wal.close()
    segs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".log"))
    assert len(segs) >= 3
    pristine = (tmp_path / segs[1]).read_bytes()
    for byte in range(SEGMENT_HEADER_BYTES):
        damaged = bytearray(pristine)
        damaged[byte] ^= 0x01
        (tmp_path / segs[1]).write_bytes(bytes(damaged))
        with pytest.raises(WalCorruption) as info:
            open_wal(tmp_path, opts)
        assert info.value.path.endswith(segs[1])
    (tmp_path / segs[1]).write_bytes(pristine)
    os.rename(tmp_path / segs[1], tmp_path / "aside")
    with pytest.raises(WalCorruption, match="sequence jumps"):
        open_wal(tmp_path, opts)


def test_leftovers_of_interrupted_segment_creation(tmp_path):
    write_records(tmp_path, sample_records(3))
    (tmp_path / "wal-0000000000000002-0000000000000009.log.tmp").write_bytes(b"half")
    (tmp_path / "wal-0000000000000002-0000000000000009.log").write_bytes(bytes(10))
    wal, got, _ = open_wal(tmp_path)
    assert got == sample_records(3)
    assert sorted(os.listdir(tmp_path)) == ["wal-0000000000000001-0000000000000000.log", "wal.lock"]
    wal.append(sample_records(1))
    wal.sync()
    wal.close()
    assert open_wal(tmp_path)[1] == sample_records(3) + sample_records(1)


def test_rotation_prologue_and_release(tmp_path):
    state = {"last": 0}

    def start():
        return state["last"] + 1, [(RecordType.HARD_STATE, b"prologue@%d" % state["last"])]

    opts = WalOptions(segment_bytes=4096)
    wal, _, _ = open_wal(tmp_path, opts, segment_start=start)
    for i in range(1, 41):
        wal.append([(RecordType.ENTRIES, b"%d:" % i + bytes(500))])
        state["last"] = i
        wal.sync()
    paths = wal.segment_paths()
    assert len(paths) >= 5
    for p in paths:
        assert os.path.getsize(p) < 4096 + 600  # overshoot bounded by one sync's write
    firsts = [int(os.path.basename(p)[21:37], 16) for p in paths]
    assert firsts == sorted(firsts) and firsts[0] == 1
    wal.close()
    wal, got, seen = open_wal(tmp_path, opts, segment_start=start)
    entries = [p for t, p in got if t == RecordType.ENTRIES]
    assert [int(p.split(b":")[0]) for p in entries] == list(range(1, 41))
    heads = [r.payload for r in seen if r.offset == SEGMENT_HEADER_BYTES]
    assert heads[0] == b"prologue@0" and all(h.startswith(b"prologue@") for h in heads)
    # Release up to index 20: only segments whose successor starts at <= 21 go.
    deleted = wal.release_to(20)
    assert deleted == paths[:len(deleted)] and deleted
    remaining = wal.segment_paths()
    assert int(os.path.basename(remaining[0])[21:37], 16) <= 21
    assert len(remaining) == 1 or int(os.path.basename(remaining[1])[21:37], 16) > 21
    assert wal.release_to(10**9)[-1] != remaining[-1]  # the active segment is never deleted
    assert wal.segment_paths() == [remaining[-1]]
    wal.close()
    _, got, _ = open_wal(tmp_path, opts, segment_start=start)
    assert got[0] == (RecordType.HARD_STATE, b"prologue@%d" % (firsts[-1] - 1))
