"""WAL record/segment layer on real files: framing, group commit, torn tails, corruption, rotation."""
import logging
import os
import random
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.runtime.wal import (
    BATCH_HEADER_BYTES,
    MAX_ZERO_AHEAD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    ZERO_AHEAD_BYTES,
    FsyncPolicy,
    RecordPos,
    RecordType,
    Wal,
    WalCorruption,
    WalLocked,
    WalOptions,
    WalRecordTooLarge,
    batch_header_at,
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


def framed_size(records):
    return sum(len(encode_record(t, p)) for t, p in records)


def tail_after(path, offset):
    """The bytes of the file at `path` from `offset` to its end."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def test_round_trip_and_positions(tmp_path):
    recs = sample_records(20)
    positions = write_records(tmp_path / "w", recs)
    wal, got, seen = open_wal(tmp_path / "w")
    assert got == recs
    assert [RecordPos(r.seq, r.offset) for r in seen] == positions
    assert positions[0] == RecordPos(1, SEGMENT_HEADER_BYTES + BATCH_HEADER_BYTES)
    for pos, rec in zip(positions, recs):
        assert wal.read_record(pos) == rec
    wal.close()


def test_append_only_buffers_until_sync(tmp_path):
    wal, _, _ = open_wal(tmp_path)
    seg = only_segment(tmp_path)
    before = os.path.getsize(seg)
    assert before == wal.active_segment_size()  # a new segment: header + prologue, no zeros yet
    pos = wal.append(sample_records(5))
    assert os.path.getsize(seg) == before  # group commit: nothing written yet
    assert wal.read_record(pos[2]) == sample_records(5)[2]  # readable from the buffer
    assert wal.sync() is True
    assert wal.active_segment_size() == before + BATCH_HEADER_BYTES + framed_size(sample_records(5))
    assert os.path.getsize(seg) == ZERO_AHEAD_BYTES  # zeros written ahead in the same write
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


def record_end(pos, rec):
    return pos.offset + len(encode_record(*rec))


def test_torn_tail_cut_at_every_byte_of_last_batch(tmp_path):
    recs = sample_records(6)
    wal, _, _ = open_wal(tmp_path / "base")
    wal.append(recs[:-1])
    wal.sync()
    batch_start = wal.active_segment_size()  # the last batch: one record after its header
    last_pos = wal.append(recs[-1:])[0]
    wal.sync()
    wal.close()
    seg_name = os.path.basename(only_segment(tmp_path / "base"))
    size = record_end(last_pos, recs[-1])  # the logical end; zeros follow it
    last_batch = (tmp_path / "base" / seg_name).read_bytes()[:size]
    for cut in range(batch_start, size):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "base", d)
        os.truncate(d / seg_name, cut)
        wal, got, _ = open_wal(d)
        assert got == recs[:-1], cut
        if not any(last_batch[batch_start:cut]):
            # A clean batch boundary (or only the zero gap before a header): zero-filled
            # space, the clean end. Nothing to repair; the next write goes over those zeros.
            assert wal.repaired is None and os.path.getsize(d / seg_name) == cut
        else:
            assert wal.repaired.offset == batch_start and wal.repaired.dropped_bytes == cut - batch_start
            assert os.path.getsize(d / seg_name) == batch_start
        assert wal.active_segment_size() == batch_start
        # The WAL continues after the repair.
        wal.append([(RecordType.HARD_STATE, b"after repair")])
        wal.sync()
        wal.close()
        _, got, _ = open_wal(d)
        assert got == recs[:-1] + [(RecordType.HARD_STATE, b"after repair")]
        shutil.rmtree(d)


def test_zero_tail_after_a_torn_tail_repair_is_the_clean_end(tmp_path, caplog):
    recs = sample_records(4)
    wal, _, _ = open_wal(tmp_path)
    wal.append(recs)
    wal.sync()
    batch_start = wal.active_segment_size()
    pos = wal.append([(RecordType.ENTRIES, b"x" * 2000)])[0]  # spans sectors
    wal.sync()
    wal.close()
    seg = only_segment(tmp_path)
    os.truncate(seg, pos.offset + 1000)  # the write's end never landed (size not extended)
    wal, got, _ = open_wal(tmp_path)
    assert got == recs and wal.repaired.offset == batch_start
    wal.close()
    assert os.path.getsize(seg) == batch_start
    with open(seg, "ab") as f:  # zeros written ahead (or a size extension whose blocks never landed)
        f.write(bytes(5000))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="xraft.wal"):
        wal, got, _ = open_wal(tmp_path)
    assert got == recs and wal.repaired is None and not caplog.records
    assert os.path.getsize(seg) == batch_start + 5000  # kept: writes overwrite them
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
    heads = [r.payload for r in seen if r.offset == SEGMENT_HEADER_BYTES + BATCH_HEADER_BYTES]
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


# ---------------------------------------------------------------- zero-ahead


def record_ends(seen):
    """seq -> end of the last record replay saw in that segment (its logical size)."""
    ends = {}
    for r in seen:
        ends[r.seq] = max(ends.get(r.seq, 0), r.offset + RECORD_HEADER_BYTES + len(r.payload))
    return ends


def test_zero_ahead_option_bounds():
    WalOptions(zero_ahead_bytes=0).validate()
    WalOptions(zero_ahead_bytes=MAX_ZERO_AHEAD_BYTES).validate()
    for bad in (-1, MAX_ZERO_AHEAD_BYTES + 1):
        with pytest.raises(ValueError, match="zero_ahead_bytes"):
            WalOptions(zero_ahead_bytes=bad).validate()


def test_active_segment_is_written_ahead_into_zeros_and_reopens_exactly(tmp_path, caplog):
    wal, _, _ = open_wal(tmp_path)
    seg = only_segment(tmp_path)
    recs = sample_records(30, size=300)
    positions = []
    for k in range(0, 30, 3):
        positions += wal.append(recs[k:k + 3])
        assert wal.sync() is True
    logical = wal.active_segment_size()
    assert logical == record_end(positions[-1], recs[-1])
    assert os.path.getsize(seg) == ZERO_AHEAD_BYTES > logical
    assert tail_after(seg, logical) == bytes(ZERO_AHEAD_BYTES - logical)
    wal.close()

    with caplog.at_level(logging.WARNING, logger="xraft.wal"):
        wal, got, seen = open_wal(tmp_path)
    assert got == recs and [RecordPos(r.seq, r.offset) for r in seen] == positions
    assert wal.repaired is None and not caplog.records  # a zero tail is no repair
    assert wal.active_segment_size() == logical and os.path.getsize(seg) == ZERO_AHEAD_BYTES
    more = [(RecordType.ENTRIES, b"after reopen %d" % i) for i in range(5)]
    more_pos = wal.append(more)
    # The next batch continues at the logical end, not the file's.
    assert more_pos[0] == RecordPos(1, batch_header_at(logical) + BATCH_HEADER_BYTES)
    assert wal.sync() is True
    assert os.path.getsize(seg) == ZERO_AHEAD_BYTES  # overwrote zeros: no size change
    for pos, rec in zip(positions + more_pos, recs + more):
        assert wal.read_record(pos) == rec
    wal.close()

    wal, got, _ = open_wal(tmp_path)
    assert got == recs + more and wal.repaired is None
    assert tail_after(seg, wal.active_segment_size()) == bytes(ZERO_AHEAD_BYTES - wal.active_segment_size())
    wal.close()


def test_zero_ahead_off_writes_only_records(tmp_path):
    wal, _, _ = open_wal(tmp_path, WalOptions(zero_ahead_bytes=0))
    wal.append(sample_records(4))
    wal.sync()
    assert os.path.getsize(only_segment(tmp_path)) == wal.active_segment_size()
    wal.close()
    assert open_wal(tmp_path)[1] == sample_records(4)


def rotated_wal(path, opts, n=40, size=500):
    wal, _, _ = open_wal(path, opts)
    recs = [(RecordType.ENTRIES, b"%d:" % i + bytes(size)) for i in range(n)]
    for rec in recs:
        wal.append([rec])
        wal.sync()
    return wal, recs


def test_rotation_truncates_sealed_segments_to_their_logical_size(tmp_path):
    opts = WalOptions(segment_bytes=4096, zero_ahead_bytes=1024)
    wal, recs = rotated_wal(tmp_path, opts)
    paths = wal.segment_paths()
    assert len(paths) >= 5
    active_size = wal.active_segment_size()
    wal.close()
    _, got, seen = open_wal(tmp_path, opts)
    assert got == recs
    ends = record_ends(seen)
    for k, p in enumerate(paths[:-1]):
        assert os.path.getsize(p) == ends[k + 1], p  # sealed: no zero tail
    assert ends.get(len(paths), SEGMENT_HEADER_BYTES) == active_size  # may hold no record yet
    # The active one is zero-filled ahead, but never past segment_bytes.
    assert active_size <= os.path.getsize(paths[-1]) <= max(4096, active_size)
    assert tail_after(paths[-1], active_size) == bytes(os.path.getsize(paths[-1]) - active_size)


def test_zero_tail_on_a_non_last_segment_is_its_clean_end(tmp_path, caplog):
    opts = WalOptions(segment_bytes=4096)
    wal, recs = rotated_wal(tmp_path, opts)
    paths = wal.segment_paths()
    assert len(paths) >= 4
    wal.close()
    # A crash between a zero-ahead write and the truncation at rotation: a sealed
    # segment keeps zeros after its records (long, or shorter than a record header).
    for p, zeros in ((paths[0], 1 << 20), (paths[1], 5), (paths[2], 3000)):
        with open(p, "ab") as f:
            f.write(bytes(zeros))
    with caplog.at_level(logging.WARNING, logger="xraft.wal"):
        wal, got, seen = open_wal(tmp_path, opts)
    assert got == recs and wal.repaired is None and not caplog.records
    for r in seen:  # positions in the zero-tailed segments stay readable
        assert wal.read_record(RecordPos(r.seq, r.offset)) == (r.type, r.payload)
    assert os.path.getsize(paths[0]) == record_ends(seen)[1] + (1 << 20)  # left as it is
    wal.append([(RecordType.HARD_STATE, b"later")])
    wal.sync()
    wal.close()
    assert open_wal(tmp_path, opts)[1] == recs + [(RecordType.HARD_STATE, b"later")]


def check_segment_files(wal):
    """Sealed segments end at their last record; the active one has only zeros after it."""
    paths = wal.segment_paths()
    active = wal.active_segment_size()
    physical = os.path.getsize(paths[-1])
    assert physical >= active
    assert tail_after(paths[-1], active) == bytes(physical - active)
    return paths


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), chunk=st.sampled_from([1, 7, 64, 512, 1000, 4096]),
       segment_bytes=st.sampled_from([4096, 10_000, 1 << 20]),
       policy=st.sampled_from([FsyncPolicy.ALWAYS, FsyncPolicy.NEVER]))
def test_many_chunk_boundaries_keep_every_record(seed, chunk, segment_bytes, policy):
    rnd = random.Random(seed)
    opts = WalOptions(fsync=policy, segment_bytes=segment_bytes, zero_ahead_bytes=chunk)
    d = tempfile.mkdtemp(prefix="xraft-wal-zero-", dir=os.environ.get("XRAFT_TEST_DIR"))
    try:
        wal, _, _ = open_wal(d, opts)
        written = []  # (pos, record)
        for step in range(rnd.randint(1, 60)):
            batch = [(rnd.choice(list(RecordType)), rnd.randbytes(rnd.choice([0, 1, 9, 50, 300, 2500])))
                     for _ in range(rnd.randint(1, 5))]
            written += zip(wal.append(batch), batch)
            wal.sync()
            check_segment_files(wal)
            if rnd.random() < 0.1:  # restart: the zero tail is read back as the end
                wal.close()
                wal, got, _ = open_wal(d, opts)
                assert got == [r for _, r in written] and wal.repaired is None
        paths = check_segment_files(wal)
        for pos, rec in written:
            assert wal.read_record(pos) == rec
        wal.close()
        wal, got, seen = open_wal(d, opts)
        assert got == [r for _, r in written] and wal.repaired is None
        assert [RecordPos(r.seq, r.offset) for r in seen] == [p for p, _ in written]
        ends = record_ends(seen)
        for p in paths[:-1]:
            seq = int(os.path.basename(p)[4:20], 16)
            assert os.path.getsize(p) == ends[seq], p
        wal.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
