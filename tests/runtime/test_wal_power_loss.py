"""WAL recovery after a power cut during fdatasync, on constructed files.

Until fdatasync returns, any subset of a write's sectors may be on disk: a later
page of the last batch can be there while an earlier one is still zeros. Such
damage in the last, never-acknowledged batch is a torn tail (truncated); damage
in a batch that a later batch proves was synced, or in a last batch that fully
landed (a flipped bit), is refused. See wal.py's "Recovery".
"""
import os
import random
import shutil
import struct
import tempfile

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.runtime.wal import FsyncPolicy, RecordPos, RecordType, Wal, WalCorruption, WalError, \
    WalOptions, encode_record
from xraft.node.runtime.wal_format import BATCH_HEADER_BYTES, batch_header_at, count_zero_parts

PAGE = 4096
SECTOR = 512


def open_wal(path, options=WalOptions(), segment_start=None):
    seen = []
    wal = Wal.open(str(path), options, visit=seen.append, segment_start=segment_start)
    return wal, [(r.type, r.payload) for r in seen]


def rec(i, size):
    return (RecordType.ENTRIES, bytes((i * 31 + j) % 255 + 1 for j in range(size)))  # no zero byte


class Batches:
    """A WAL written batch by batch; remembers where each batch starts and ends."""

    def __init__(self, path, options=WalOptions()):
        self.path = str(path)
        self.wal, _ = open_wal(path, options)
        self.bounds = []  # (start, end) per batch, in the active segment
        self.records = []  # per batch

    def batch(self, records, now_ms=None):
        start = self.wal.active_segment_size()
        self.wal.append(records)
        self.wal.sync(now_ms)
        self.bounds.append((start, self.wal.active_segment_size()))
        self.records.append(list(records))
        return self.bounds[-1]

    def close(self):
        self.wal.close()
        segs = sorted(p for p in os.listdir(self.path) if p.endswith(".log"))
        assert len(segs) == 1
        self.seg = os.path.join(self.path, segs[0])
        return self

    def upto(self, k):
        return [r for b in self.records[:k] for r in b]


def zero(path, start, end):
    """Bytes [start, end) of the file never landed: they hold zeros, as before the write."""
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))


def flip(path, offset, bit=0x10):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes((b ^ bit,)))


def big_batch(n=3, size=1500, base=100):
    return [rec(base + i, size) for i in range(n)]


def first_page_after(start):
    return (start // PAGE + 1) * PAGE


# ---------------------------------------------------------------- the last batch: torn tail


@pytest.mark.parametrize("missing", ["header page", "middle page"])
def test_later_page_of_last_batch_landed_earlier_page_zeros_is_a_torn_tail(tmp_path, missing):
    w = Batches(tmp_path)
    for i in range(5):
        w.batch([rec(i, 200)])
    while w.wal.active_segment_size() % PAGE < PAGE - 600:  # last batch starts late in a page
        w.batch([rec(len(w.records), 300)])
    start, end = w.batch(big_batch(6))
    w.close()
    # Spans three pages, and its last record lies wholly after the middle one.
    assert end - len(encode_record(*big_batch(6)[-1])) > first_page_after(start) + PAGE
    if missing == "header page":
        zero(w.seg, start, first_page_after(start))
    else:
        zero(w.seg, first_page_after(start), min(first_page_after(start) + PAGE, end))
    wal, got = open_wal(tmp_path)
    assert got == w.upto(len(w.records) - 1)  # every earlier record, none of the last batch
    assert wal.repaired.offset == start and os.path.getsize(w.seg) == start
    wal.append([(RecordType.HARD_STATE, b"after")])
    wal.sync()
    wal.close()
    assert open_wal(tmp_path)[1] == w.upto(len(w.records) - 1) + [(RecordType.HARD_STATE, b"after")]


def test_unsynced_batches_under_fsync_batch_are_one_torn_tail(tmp_path):
    # Under fsync=batch several writes share one fdatasync: damage in any of them,
    # with later unsynced batches intact after it, is still a torn tail.
    opts = WalOptions(fsync=FsyncPolicy.BATCH, batch_interval_ms=10**9, batch_bytes=10**9)
    w = Batches(tmp_path, opts)
    w.batch([rec(0, 100)], now_ms=1)  # the first sync always fdatasyncs
    start, end = w.batch(big_batch(4), now_ms=2)  # not synced
    w.batch([rec(9, 100)], now_ms=3)  # not synced either: its header says so
    w.close()
    zero(w.seg, first_page_after(start), first_page_after(start) + PAGE)
    wal, got = open_wal(tmp_path, opts)
    assert got == w.upto(1) and wal.repaired.offset == start
    wal.close()


def test_zero_sectors_written_as_zeros_do_not_hide_a_missing_sector(tmp_path):
    # Records may hold whole zero sectors; the batch header counts them, so one more
    # all-zero sector part is a sector that never landed.
    w = Batches(tmp_path)
    w.batch([rec(0, 100)])
    start, end = w.batch([(RecordType.ENTRIES, bytes(3000)), rec(1, 2000)])
    w.close()
    raw = open(w.seg, "rb").read()
    victim = next(s for s in range(first_page_after(start) - PAGE, end, SECTOR)
                  if s > start and any(raw[s:s + SECTOR]))
    zero(w.seg, victim, min(victim + SECTOR, end))
    wal, got = open_wal(tmp_path)
    assert got == w.upto(1) and wal.repaired.offset == start
    wal.close()


# ---------------------------------------------------------------- earlier batches: corruption


@pytest.mark.parametrize("missing", ["header page", "middle page"])
def test_same_damage_in_a_batch_a_later_batch_proves_synced_is_corruption(tmp_path, missing):
    w = Batches(tmp_path)
    w.batch([rec(0, 200)])
    start, end = w.batch(big_batch(4))
    w.batch([rec(7, 50)])  # written after the big batch's fdatasync returned
    w.close()
    if missing == "header page":
        zero(w.seg, start, first_page_after(start))
    else:
        zero(w.seg, first_page_after(start), min(first_page_after(start) + PAGE, end))
    pristine = open(w.seg, "rb").read()
    with pytest.raises(WalCorruption, match="acknowledged") as info:
        open_wal(tmp_path)
    assert start <= info.value.offset < end
    assert open(w.seg, "rb").read() == pristine  # never "repaired"


# ---------------------------------------------------------------- a flipped bit in an acknowledged record


@pytest.mark.parametrize("after", ["later batch", "later torn batch", "nothing"])
def test_bit_flip_in_last_acknowledged_record_is_refused(tmp_path, after):
    w = Batches(tmp_path)
    w.batch([rec(0, 200)])
    w.batch([rec(1, 300), rec(2, 300)])  # acknowledged: sync() returned
    last = RecordPos(1, w.bounds[-1][1] - len(encode_record(*rec(2, 300))))
    if after != "nothing":
        start, end = w.batch(big_batch(3))
    w.close()
    if after == "later torn batch":  # its header landed, its end did not
        zero(w.seg, first_page_after(start), end)
    flip(w.seg, last.offset + 100)
    pristine = open(w.seg, "rb").read()
    with pytest.raises(WalCorruption) as info:
        open_wal(tmp_path)
    assert info.value.offset == last.offset  # names the damaged record
    assert open(w.seg, "rb").read() == pristine


def test_bit_flip_anywhere_in_a_last_batch_that_fully_landed_is_refused(tmp_path):
    w = Batches(tmp_path)
    w.batch([rec(0, 100)])
    start, end = w.batch([rec(1, 700), (RecordType.ENTRIES, bytes(1200)), rec(2, 30)])
    w.close()
    pristine = open(w.seg, "rb").read()
    for off in sorted({start, start + 5, start + 39, start + 40, start + 700, start + 1000,
                       start + 1500, end - 20, end - 1}):
        with open(w.seg, "wb") as f:
            f.write(pristine)
        flip(w.seg, off, 1 << (off % 8))
        with pytest.raises(WalCorruption):
            open_wal(tmp_path)


def test_a_tear_inside_a_sector_is_refused_not_guessed(tmp_path):
    # Outside the model (sectors land whole): half a sector of the last batch new, half
    # still zeros. No part is all zeros, so it reads as landed-and-damaged: refused.
    w = Batches(tmp_path)
    w.batch([rec(0, 100)])
    start, end = w.batch(big_batch(2))
    w.close()
    s = (start // SECTOR + 2) * SECTOR  # a whole sector inside the batch
    assert s + SECTOR < end
    zero(w.seg, s + SECTOR // 2, s + SECTOR)
    with pytest.raises(WalCorruption, match="every sector of this last batch landed"):
        open_wal(tmp_path)


# ---------------------------------------------------------------- chunk boundaries


@pytest.mark.parametrize("landed", ["new chunk only", "size not extended", "nothing of the new chunk"])
def test_torn_batch_across_a_zero_ahead_chunk_boundary(tmp_path, landed):
    chunk = 4096
    opts = WalOptions(zero_ahead_bytes=chunk)
    w = Batches(tmp_path, opts)
    while w.wal.active_segment_size() < chunk - 700:
        w.batch([rec(len(w.records), 150)])
    start, end = w.batch(big_batch(2, size=900))  # extends the file into a new chunk
    w.close()
    assert start < chunk < end and os.path.getsize(w.seg) == 2 * chunk
    if landed == "new chunk only":
        zero(w.seg, start, chunk)
    elif landed == "size not extended":
        os.truncate(w.seg, chunk)
    else:
        zero(w.seg, chunk, 2 * chunk)
    wal, got = open_wal(tmp_path, opts)
    assert got == w.upto(len(w.records) - 1) and wal.repaired.offset == start
    wal.close()


# ---------------------------------------------------------------- format version


def segment_header(version, seq, first):
    head = struct.pack(">8sHHQQ", b"XRFTWAL\x00", version, 0, seq, first)
    return head + struct.pack(">I", crc32c.crc32c(head))


def write_v1_segment(d, seq, first, records, zeros=0):
    """A segment as xraft's format version 1 wrote it: header, records back to back, zeros."""
    os.makedirs(d, exist_ok=True)
    path = os.path.join(str(d), "wal-%016x-%016x.log" % (seq, first))
    with open(path, "wb") as f:
        f.write(segment_header(1, seq, first) + b"".join(encode_record(*r) for r in records) + bytes(zeros))
    return path


V1_PROLOGUE = [(RecordType.HARD_STATE, b"v2 prologue")]


def test_version_1_wal_is_read_and_continued_in_a_version_2_segment(tmp_path, caplog):
    old1 = [rec(i, 100) for i in range(3)]
    old2 = [rec(i, 200) for i in range(3, 6)]
    sealed = write_v1_segment(tmp_path, 1, 0, old1)
    last = write_v1_segment(tmp_path, 2, 4, old2, zeros=5000)
    wal, got = open_wal(tmp_path, segment_start=lambda: (7, V1_PROLOGUE))
    assert got == old1 + old2 and "format version 1" in caplog.text
    paths = wal.segment_paths()
    assert paths[:2] == [sealed, last] and len(paths) == 3  # writes go to a new segment
    assert os.path.getsize(last) == 32 + sum(len(encode_record(*r)) for r in old2)  # sealed: no zeros
    wal.append([(RecordType.ENTRIES, b"new")])
    wal.sync()
    wal.close()
    wal, got = open_wal(tmp_path, segment_start=lambda: (8, V1_PROLOGUE))
    assert got == old1 + old2 + V1_PROLOGUE + [(RecordType.ENTRIES, b"new")]
    assert len(wal.segment_paths()) == 3  # a version-2 last segment: no new rotation
    wal.close()


def test_version_1_rules_for_its_last_segment(tmp_path):
    recs = [rec(i, 300) for i in range(4)]
    framed = [encode_record(*r) for r in recs]
    # A torn last record (cut short, zeros after): truncated as version 1 did.
    path = write_v1_segment(tmp_path / "torn", 1, 0, recs)
    with open(path, "r+b") as f:
        f.truncate(32 + sum(map(len, framed)) - 50)
        f.seek(0, 2)
        f.write(bytes(1000))
    wal, got = open_wal(tmp_path / "torn", segment_start=lambda: (1, V1_PROLOGUE))
    assert got == recs[:3] and wal.repaired.offset == 32 + sum(map(len, framed[:3]))
    wal.close()
    # Damage with a valid record after it: refused.
    path = write_v1_segment(tmp_path / "mid", 1, 0, recs)
    flip(path, 32 + 20)
    with pytest.raises(WalCorruption, match="a valid record follows"):
        open_wal(tmp_path / "mid")


def test_crash_during_the_version_1_to_2_rotation(tmp_path):
    recs = [rec(i, 100) for i in range(3)]
    # Killed after the new segment was renamed into place but before the old one's
    # zero tail was truncated (or before the .tmp was renamed): both open.
    write_v1_segment(tmp_path / "renamed", 1, 0, recs, zeros=3000)
    with open(tmp_path / "renamed" / ("wal-%016x-%016x.log" % (2, 4)), "wb") as f:
        f.write(segment_header(2, 2, 4))
    write_v1_segment(tmp_path / "tmp", 1, 0, recs, zeros=3000)
    with open(tmp_path / "tmp" / ("wal-%016x-%016x.log.tmp" % (2, 4)), "wb") as f:
        f.write(segment_header(2, 2, 4)[:20])
    for d in ("renamed", "tmp"):
        wal, got = open_wal(tmp_path / d, segment_start=lambda: (4, V1_PROLOGUE))
        assert got == recs and len(wal.segment_paths()) == 2, d
        wal.close()


def test_newer_wal_version_is_refused_with_a_clear_message(tmp_path):
    (tmp_path / "wal-0000000000000001-0000000000000000.log").write_bytes(segment_header(3, 1, 0))
    with pytest.raises(WalError, match="version 3 is not readable by this build, which reads versions 1, 2"):
        Wal.open(str(tmp_path))


# ---------------------------------------------------------------- property


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), chunk=st.sampled_from([0, 1, 7, 512, 1000, 4096]),
       segment_bytes=st.sampled_from([4096, 10_000, 1 << 20]),
       policy=st.sampled_from([FsyncPolicy.ALWAYS, FsyncPolicy.BATCH]))
def test_torn_damage_after_the_last_fsync_recovers_the_synced_prefix(seed, chunk, segment_bytes, policy):
    """Under fsync=always the unsynced region is the last batch; under fsync=batch
    (fdatasync only on a segment's first sync and at rotation here) it is every
    batch since the last fdatasync. Power cut: any of its sectors missing."""
    rnd = random.Random(seed)
    opts = WalOptions(fsync=policy, segment_bytes=segment_bytes, zero_ahead_bytes=chunk,
                      batch_interval_ms=10**9, batch_bytes=10**9)
    prologue = [(RecordType.HARD_STATE, b"prologue")]
    clock = iter(range(1, 10**6))
    d = tempfile.mkdtemp(prefix="xraft-wal-torn-", dir=os.environ.get("XRAFT_TEST_DIR"))
    try:
        wal, _ = open_wal(d, opts, segment_start=lambda: (1, prologue))

        def batch():
            recs = [(rnd.choice(list(RecordType)), rnd.choice([bytes, rnd.randbytes])(
                rnd.choice([0, 1, 9, 50, 300, 700, 2500]))) for _ in range(rnd.randint(1, 4))]
            segs = len(wal.segment_paths())
            start = wal.active_segment_size()
            wal.append(recs)
            synced = wal.sync(next(clock))
            rotated = len(wal.segment_paths()) != segs
            return (recs, start, wal.active_segment_size()), synced or rotated, rotated

        durable = list(prologue)  # records as replay returns them, prologues included
        unsynced = []  # (records, start, end) of the batches since the last completed fdatasync

        def settle(batches, rotated):
            durable.extend(r for recs, _, _ in batches for r in recs)
            durable.extend(prologue if rotated else [])
            unsynced.clear()

        for _ in range(rnd.randint(0, 30)):
            b, synced, rotated = batch()
            if synced:
                settle(unsynced + [b], rotated)
            else:
                unsynced.append(b)
        while True:  # the last batch: the power cut interrupts its (or a later) fdatasync
            b, _, rotated = batch()
            if not rotated:
                unsynced.append(b)
                break
            settle(unsynced + [b], rotated)
        start, end = unsynced[0][1], unsynced[-1][2]
        seg = wal.segment_paths()[-1]
        wal.close()
        raw = open(seg, "rb").read()
        # Unlanded sectors of the unsynced writes hold what they held before: zeros.
        sectors = list(range(start // SECTOR * SECTOR, end, SECTOR))
        for s in rnd.sample(sectors, rnd.randint(1, len(sectors))):
            zero(seg, max(s, start), min(s + SECTOR, end))
        if rnd.random() < 0.3:  # and the file's size may not reach the end of the writes
            os.truncate(seg, rnd.randint(start, len(raw)))
        damaged = open(seg, "rb").read()
        expected, torn_at = list(durable), -1
        for recs, b_start, b_end in unsynced:  # batches before the first damaged one survive
            if damaged[b_start:b_end] != raw[b_start:b_end]:
                torn_at = b_start
                break
            expected += recs
        wal, got = open_wal(d, opts, segment_start=lambda: (1, prologue))
        assert got == expected
        if torn_at < 0 or not any(damaged[torn_at:]):  # intact, or nothing of it landed: clean end
            assert wal.repaired is None
        else:
            assert wal.repaired.offset == torn_at and os.path.getsize(seg) == torn_at
        wal.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=3000), at=st.integers(32, 5000),
       holes=st.lists(st.tuples(st.integers(0, 2999), st.sampled_from([1, 100, 511, 512, 513, 1100])),
                      max_size=6))
def test_count_zero_parts_counts_every_all_zero_sector_part(data, at, holes):
    buf = bytearray(data)
    for start, n in holes:  # zero runs of every length, anywhere
        buf[start:start + n] = bytes(len(buf[start:start + n]))
    at = batch_header_at(at)
    base = at + BATCH_HEADER_BYTES  # the records follow the header
    end = base + len(buf)
    parts = [(s, min(s + SECTOR, end)) for s in range((at // SECTOR + 1) * SECTOR, end, SECTOR)]
    expected = sum(not any(buf[a - base:b - base]) for a, b in parts)
    assert count_zero_parts(bytes(buf), base, at, end) == expected
