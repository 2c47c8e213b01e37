# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of entry.py's `_decode_xadd_batch` (every replica decodes every record).

Same arguments, same XAddBatch, same CorruptEntry texts in the same order of
checks as the pure function (entry.py is the reference; tests/kernels compares
them on random and on mutated records). The bytes come from disk or a peer:
every read is bounds-checked against `end` before it happens, as there.

Built by setup.py (Cython) at `pip install`; entry.py loads it through
xraft.node.accel unless XRAFT_PURE=1.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

import sys

cdef extern from "Python.h":
    bint PyBytes_CheckExact(object o)


cdef enum:
    ID_AUTO = 0
    ID_AUTO_SEQ = 1
    ID_EXPLICIT = 2
    OPT_NOMKSTREAM = 0x01
    OPT_MAXLEN = 0x02
    OPT_MINID = 0x04
    OPT_APPROX = 0x08
    OPT_LIMIT = 0x10
    OPT_IDMP = 0x20
    OPT_IDMP_SEQ = 0x40
    OPTS_ALL = 0x7F
    XB_HEAD = 29                  # opts u8, thr_a u64, thr_b u64, limit u64, klen u32
    MIN_XENTRY = 13               # AUTO, npair=1, two empty strings
# The limits (MAX_TXN_COMMANDS, MAX_ARGC, MAX_ARG_BYTES) are read from entry.py at each
# call, as the pure functions read their globals: one definition, and tests that lower
# them see both kernels obey.


cdef inline uint32_t _u32(const unsigned char *p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t _u64(const unsigned char *p) noexcept:
    return (<uint64_t>_u32(p) << 32) | <uint64_t>_u32(p + 4)


cdef inline bytes _slice(const unsigned char *d, Py_ssize_t pos, Py_ssize_t n):
    return PyBytes_FromStringAndSize(<const char *>d + pos, n)


def decode_xadd_batch(data, Py_ssize_t pos, Py_ssize_t end, n_obj):
    """entry._decode_xadd_batch, compiled: (XAddBatch, position after it)."""
    entry = sys.modules["xraft.node.fsm.entry"]
    if not PyBytes_CheckExact(data) or end > PyBytes_GET_SIZE(data) or pos < 0 or pos > end:
        return entry.PURE_KERNELS["_decode_xadd_batch"](data, pos, end, n_obj)
    CorruptEntry = entry.CorruptEntry
    cdef Py_ssize_t MAX_PAIRS = entry.MAX_ARGC // 2, MAX_ARG_BYTES = entry.MAX_ARG_BYTES
    MAX_TXN_COMMANDS = entry.MAX_TXN_COMMANDS
    cdef const unsigned char *d = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t start = pos, klen, ilen, i, j, p, total, maxlen, m
    cdef int64_t n
    cdef unsigned int opts, kind
    cdef uint64_t a, b, limit, npair
    cdef object ms, sq, key, pid = None, strategy, threshold, first_obj = None
    cdef uint64_t first = 0
    cdef bint seq_form = False
    cdef list iids = None, entries, out
    cdef tuple fields
    if not 1 <= n_obj <= MAX_TXN_COMMANDS or n_obj * MIN_XENTRY > end - pos - XB_HEAD:
        raise CorruptEntry("bad XADD batch entry count %d" % n_obj)
    n = n_obj
    opts = d[pos]
    a = _u64(d + pos + 1)
    b = _u64(d + pos + 9)
    limit = _u64(d + pos + 17)
    klen = _u32(d + pos + 25)
    pos += XB_HEAD
    if opts & ~OPTS_ALL:
        raise CorruptEntry("unknown XADD batch option bits %#x" % opts)
    if opts & OPT_MAXLEN and opts & OPT_MINID:
        raise CorruptEntry("XADD batch with both MAXLEN and MINID")
    if opts & OPT_MAXLEN:
        strategy, threshold = entry.MAXLEN, a
        if b:
            raise CorruptEntry("XADD batch MAXLEN with a second threshold word")
    elif opts & OPT_MINID:
        strategy, threshold = entry.MINID, (a, b)
    else:
        strategy, threshold = None, 0
        if opts & (OPT_APPROX | OPT_LIMIT) or a or b:
            raise CorruptEntry("XADD batch trim details without a strategy")
    if not opts & OPT_LIMIT and limit:
        raise CorruptEntry("XADD batch limit without LIMIT")
    if klen > MAX_ARG_BYTES or klen > end - pos:
        raise CorruptEntry("XADD batch key of %d bytes runs past the end" % klen)
    key = _slice(d, pos, klen)
    pos += klen
    if opts & OPT_IDMP:
        pid, pos = entry._decode_sized(data, pos, end, 1, "IDMP producer")
        if opts & OPT_IDMP_SEQ:
            if end - pos < 8:
                raise CorruptEntry("XADD batch IDMP first id runs past the end")
            first = _u64(d + pos)
            pos += 8
            if first > <uint64_t>0xFFFFFFFFFFFFFFFF - <uint64_t>(n - 1):
                raise CorruptEntry("XADD batch IDMP ids from %d past 2**64-1" % first)
            seq_form = True
            first_obj = first
        else:
            iids = []
    elif opts & OPT_IDMP_SEQ:
        raise CorruptEntry("XADD batch IDMP_SEQ without IDMP")
    entries = []
    for i in range(n):
        if iids is not None:                # | ilen u32 | iid |, then an AUTO ID
            if end - pos < 5:
                raise CorruptEntry("XADD batch IDMP iid runs past the end")
            ilen = _u32(d + pos)
            pos += 4
            if ilen > MAX_ARG_BYTES or ilen >= end - pos or d[pos + ilen] != ID_AUTO:
                raise CorruptEntry("XADD batch IDMP iid of %d bytes out of bounds or without an auto ID" % ilen)
            iids.append(_slice(d, pos, ilen) if ilen else None)
            pos += ilen
        if end - pos < MIN_XENTRY:
            raise CorruptEntry("XADD batch entry runs past the end")
        kind = d[pos]
        if kind == ID_AUTO:
            ms = sq = 0
            pos += 1
        elif seq_form:
            raise CorruptEntry("XADD batch IDMP entry without an auto ID")
        elif kind == ID_AUTO_SEQ:
            if end - pos < 9 + MIN_XENTRY - 1:
                raise CorruptEntry("XADD batch entry ID runs past the end")
            ms = _u64(d + pos + 1)
            sq = 0
            pos += 9
        elif kind == ID_EXPLICIT:
            if end - pos < 17 + MIN_XENTRY - 1:
                raise CorruptEntry("XADD batch entry ID runs past the end")
            ms = _u64(d + pos + 1)
            sq = _u64(d + pos + 9)
            pos += 17
        else:
            raise CorruptEntry("unknown XADD batch ID kind %d" % kind)
        npair = _u32(d + pos)
        if not 1 <= npair <= MAX_PAIRS or <int64_t>(8 * npair) > end - pos - 4:
            raise CorruptEntry("bad XADD batch pair count %d" % npair)
        # The lengths (2 * npair u32s) are inside `end`: checked just above.
        total = 0
        maxlen = 0
        for j in range(2 * <Py_ssize_t>npair):
            m = _u32(d + pos + 4 + 4 * j)
            total += m
            if m > maxlen:
                maxlen = m
        p = pos + 4 + 8 * <Py_ssize_t>npair
        if total > end - p or (total > MAX_ARG_BYTES and maxlen > MAX_ARG_BYTES):
            raise CorruptEntry("XADD batch fields of %d bytes run past the end" % total)
        out = []
        for j in range(2 * <Py_ssize_t>npair):
            m = _u32(d + pos + 4 + 4 * j)
            out.append(_slice(d, p, m))
            p += m
        fields = tuple(out)
        pos = p
        entries.append((kind, ms, sq, fields))
    batch = entry.XAddBatch(key, bool(opts & OPT_NOMKSTREAM), strategy, bool(opts & OPT_APPROX), threshold,
                            limit if opts & OPT_LIMIT else None, tuple(entries), _slice(d, start, pos - start),
                            pid, hex_iids(first_obj, n) if seq_form else None if iids is None else tuple(iids),
                            first_obj)
    return batch, pos



cdef extern from "Python.h":
    bint PyTuple_CheckExact(object o)
    bint PyList_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    bint PyLong_Check(object o)
    int PyObject_RichCompareBool(object a, object b, int op) except -1

cdef object _U64_MAX_OBJ = 0xFFFFFFFFFFFFFFFF


cdef inline void _put_u32(unsigned char *p, uint64_t v) noexcept:
    p[0] = <unsigned char>((v >> 24) & 0xFF)
    p[1] = <unsigned char>((v >> 16) & 0xFF)
    p[2] = <unsigned char>((v >> 8) & 0xFF)
    p[3] = <unsigned char>(v & 0xFF)


cdef inline void _put_u64(unsigned char *p, uint64_t v) noexcept:
    _put_u32(p, v >> 32)
    _put_u32(p + 4, v & 0xFFFFFFFF)


cdef inline bint _u64_ok(object v):
    """v is an exact int in 0..2**64-1 (anything else: the reference decides)."""
    return PyLong_CheckExact(v) and v >= 0 and v <= _U64_MAX_OBJ


def encode_xentries(entries, idmp_iids):
    """entry._encode_xentries, compiled. Only well-formed input is encoded here: at the
    first thing that is not (a bad ID, an odd field count, a field that is not exact
    bytes, an input of another shape, ...) the reference runs from the start instead,
    so every error (invariant, EntryTooLarge) and its order is the reference's own."""
    cdef Py_ssize_t n, i, j, nf, size = 0, pos = 0, m
    cdef long kind
    cdef list items
    cdef tuple fields
    cdef object e, iid, ms, seq, f
    cdef bytes out
    cdef unsigned char *p
    cdef Py_ssize_t MAX_PAIRS = sys.modules["xraft.node.fsm.entry"].MAX_ARGC // 2
    if not (PyTuple_CheckExact(entries) or PyList_CheckExact(entries)) or not (
            idmp_iids is None or PyTuple_CheckExact(idmp_iids)):
        return _reference(entries, idmp_iids)
    n = len(entries)
    if n == 0 or (idmp_iids is not None and len(idmp_iids) < n):
        return _reference(entries, idmp_iids)
    # Pass 1: check everything and size it.
    items = []
    for i in range(n):
        e = entries[i]
        if not PyTuple_CheckExact(e) or len(<tuple>e) != 4:
            return _reference(entries, idmp_iids)
        k, ms, seq, f = <tuple>e
        if not PyLong_Check(k) or not (0 <= k <= 2) or not _u64_ok(ms) or not _u64_ok(seq):
            return _reference(entries, idmp_iids)
        kind = k
        if PyTuple_CheckExact(f):
            fields = <tuple>f
        elif PyList_CheckExact(f):
            fields = tuple(f)
        else:
            return _reference(entries, idmp_iids)
        nf = len(fields)
        if nf < 2 or nf & 1 or nf // 2 > MAX_PAIRS:
            return _reference(entries, idmp_iids)
        if idmp_iids is not None:
            iid = idmp_iids[i]
            if kind != ID_AUTO:
                return _reference(entries, idmp_iids)
            if iid is None:
                size += 4
            elif PyBytes_CheckExact(iid) and PyBytes_GET_SIZE(iid) > 0:
                size += 4 + PyBytes_GET_SIZE(iid)
            else:
                return _reference(entries, idmp_iids)
        if kind == ID_AUTO:
            if ms or seq:
                return _reference(entries, idmp_iids)
            size += 1
        elif kind == ID_AUTO_SEQ:
            if seq:
                return _reference(entries, idmp_iids)
            size += 9
        else:
            size += 17
        size += 4 + 4 * nf
        for j in range(nf):
            f = fields[j]
            if not PyBytes_CheckExact(f):
                return _reference(entries, idmp_iids)
            size += PyBytes_GET_SIZE(f)
        items.append((int(k), ms, seq, fields))
    # Pass 2: write.
    out = PyBytes_FromStringAndSize(NULL, size)
    p = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        kind, ms, seq, fields = items[i]
        if idmp_iids is not None:
            iid = idmp_iids[i]
            if iid is None:
                _put_u32(p + pos, 0)
                pos += 4
            else:
                m = PyBytes_GET_SIZE(iid)
                _put_u32(p + pos, m)
                memcpy(p + pos + 4, PyBytes_AS_STRING(iid), m)
                pos += 4 + m
        p[pos] = <unsigned char>kind
        pos += 1
        if kind != ID_AUTO:
            _put_u64(p + pos, <uint64_t>ms)
            pos += 8
            if kind == ID_EXPLICIT:
                _put_u64(p + pos, <uint64_t>seq)
                pos += 8
        nf = len(fields)
        _put_u32(p + pos, nf // 2)
        pos += 4
        for j in range(nf):
            _put_u32(p + pos, PyBytes_GET_SIZE(fields[j]))
            pos += 4
        for j in range(nf):
            f = fields[j]
            m = PyBytes_GET_SIZE(f)
            memcpy(p + pos, PyBytes_AS_STRING(f), m)
            pos += m
    return out, tuple(items)


cdef object _reference(entries, idmp_iids):
    return sys.modules["xraft.node.fsm.entry"].PURE_KERNELS["_encode_xentries"](entries, idmp_iids)


def hex_iids(first_obj, Py_ssize_t n):
    """entry._hex_iids, compiled: n ids from first, lowercase hex without leading zeros
    (the IDMP_SEQ form). Anything but an exact int with first + n - 1 <= 2**64-1: the
    reference's answer."""
    cdef uint64_t v, w
    cdef Py_ssize_t i, k
    cdef char buf[16]
    cdef list out
    if not PyLong_CheckExact(first_obj) or n < 0 or not (0 <= first_obj <= _U64_MAX_OBJ - max(n - 1, 0)):
        return _reference_hex(first_obj, n)
    v = first_obj
    out = []
    for i in range(n):
        k = 16
        w = v
        while True:
            k -= 1
            buf[k] = _HEX_DIGITS[w & 15]
            w >>= 4
            if not w:
                break
        out.append(PyBytes_FromStringAndSize(buf + k, 16 - k))
        v += 1
    return tuple(out)


cdef const char *_HEX_DIGITS = b"0123456789abcdef"


cdef object _reference_hex(first_obj, n):
    return sys.modules["xraft.node.fsm.entry"].PURE_KERNELS["_hex_iids"](first_obj, n)
