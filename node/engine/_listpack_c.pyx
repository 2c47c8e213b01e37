# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of listpack.py's XADD hot path (`lp_encode`, `lp_append_entries`) and of
stream.py's node check on load (`check_stream_node`).

Same arguments, same bytes, same errors as the pure functions (listpack.py is
the reference; tests/kernels/test_listpack_kernels.py compares them on random
inputs). Exact `bytes` and `int` elements are encoded here; anything else
(bytearray, memoryview, bool, an int outside int64, a string over 1 GiB) goes
to the pure lp_encode, so every odd case and every error is the reference's own.

Built by setup.py (Cython) at `pip install`; listpack.py loads it through
xraft.node.accel unless XRAFT_PURE=1.
"""
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy

import sys

from xraft.node.invariant import invariant

cdef extern from "Python.h":
    bint PyBytes_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    bint PyByteArray_CheckExact(object o)
    bint PyList_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

cdef enum:
    MAX_STRING = 1 << 30          # LISTPACK_MAX_SAFETY_SIZE: larger strings go to the reference (invariant)
    NUMELE_UNKNOWN = 0xFFFF
cdef uint64_t UINT32_MAX = 0xFFFFFFFF


cdef object _pure():
    # listpack.py imports this module at its end, so read it at call time.
    return sys.modules["xraft.node.engine.listpack"]


cdef inline bint _str_to_i64(const unsigned char *s, Py_ssize_t n, int64_t *out) noexcept:
    """redis' lpStringToInt64 (listpack.string_to_int64): s spells an int64 canonically."""
    cdef Py_ssize_t i = 0
    cdef bint neg = False
    cdef uint64_t v = 0, d
    if n == 0 or n > 20:
        return False
    if s[0] == 45:                                # '-' then '1'..'9'
        if n < 2 or not (49 <= s[1] <= 57):
            return False
        neg = True
        i = 1
    elif s[0] == 48:                              # '0' only alone
        if n == 1:
            out[0] = 0
            return True
        return False
    elif not (49 <= s[0] <= 57):
        return False
    while i < n:
        d = <uint64_t>s[i] - 48
        if d > 9:
            return False
        if v > (<uint64_t>0xFFFFFFFFFFFFFFFF - d) // 10:
            return False                          # beyond uint64: beyond int64 too
        v = v * 10 + d
        i += 1
    if neg:
        if v > (<uint64_t>1 << 63):
            return False
        out[0] = <int64_t>(0 - v)
    else:
        if v > <uint64_t>0x7FFFFFFFFFFFFFFF:
            return False
        out[0] = <int64_t>v
    return True


cdef inline Py_ssize_t _put_int(unsigned char *p, int64_t v) noexcept:
    """The complete entry for v (listpack._int_entry) at p; returns its size."""
    cdef uint64_t u = <uint64_t>v
    cdef int width, k
    if 0 <= v <= 127:
        p[0] = <unsigned char>v
        p[1] = 1
        return 2
    if -4096 <= v <= 4095:
        u = u & 0x1FFF
        p[0] = <unsigned char>(0xC0 | (u >> 8))
        p[1] = <unsigned char>(u & 0xFF)
        p[2] = 2
        return 3
    if -32768 <= v <= 32767:
        p[0] = 0xF1
        width = 2
    elif -8388608 <= v <= 8388607:
        p[0] = 0xF2
        width = 3
    elif -2147483648 <= v <= 2147483647:
        p[0] = 0xF3
        width = 4
    else:
        p[0] = 0xF4
        width = 8
    for k in range(width):
        p[1 + k] = <unsigned char>((u >> (8 * k)) & 0xFF)
    p[1 + width] = <unsigned char>(width + 1)     # back-length of a 1 + width byte entry
    return width + 2


cdef inline Py_ssize_t _put_backlen(unsigned char *p, uint64_t length) noexcept:
    """listpack._encode_backlen: leftmost first, low 7 bits rightmost, 0x80 on all but the leftmost."""
    cdef Py_ssize_t n, i
    if length <= 127:
        n = 1
    elif length < 16383:
        n = 2
    elif length < 2097151:
        n = 3
    elif length < 268435455:
        n = 4
    else:
        n = 5
    i = n - 1
    while i >= 0:
        p[i] = <unsigned char>((length & 127) | (0x80 if i else 0))
        length >>= 7
        i -= 1
    return n


cdef inline Py_ssize_t _put_bytes(unsigned char *p, const unsigned char *s, Py_ssize_t n) noexcept:
    """The complete entry for the bytes s (n <= MAX_STRING) at p; returns its size."""
    cdef int64_t v
    cdef Py_ssize_t h
    if _str_to_i64(s, n, &v):
        return _put_int(p, v)
    if n < 64:
        p[0] = <unsigned char>(0x80 | n)
        h = 1
    elif n < 4096:
        p[0] = <unsigned char>(0xE0 | (n >> 8))
        p[1] = <unsigned char>(n & 0xFF)
        h = 2
    else:
        p[0] = 0xF0
        p[1] = <unsigned char>(n & 0xFF)
        p[2] = <unsigned char>((n >> 8) & 0xFF)
        p[3] = <unsigned char>((n >> 16) & 0xFF)
        p[4] = <unsigned char>((n >> 24) & 0xFF)
        h = 5
    memcpy(p + h, s, n)
    return h + n + _put_backlen(p + h + n, h + n)


cdef inline bint _fast(object ele, int64_t *iv) except -1:
    """True if ele is encoded here (exact bytes up to 1 GiB, exact int in int64; for
    an int, *iv holds it); False: the reference encodes it."""
    cdef int overflow = 0
    if PyBytes_CheckExact(ele):
        return PyBytes_GET_SIZE(ele) <= MAX_STRING
    if PyLong_CheckExact(ele):
        iv[0] = PyLong_AsLongLongAndOverflow(ele, &overflow)
        return overflow == 0
    return False


def lp_encode(ele):
    """listpack.lp_encode, compiled."""
    cdef unsigned char small[32]          # an int entry (<= 10 bytes) or a string of <= 20 (<= 22)
    cdef int64_t iv
    cdef Py_ssize_t n
    cdef bytes out
    if not _fast(ele, &iv):
        return _pure()._lp_encode_py(ele)
    if PyLong_CheckExact(ele):
        return PyBytes_FromStringAndSize(<char *>small, _put_int(small, iv))
    n = PyBytes_GET_SIZE(ele)
    if n <= 20:
        return PyBytes_FromStringAndSize(<char *>small, _put_bytes(small, <const unsigned char *>PyBytes_AS_STRING(ele), n))
    out = PyBytes_FromStringAndSize(NULL, n + 10)
    n = _put_bytes(<unsigned char *>PyBytes_AS_STRING(out), <const unsigned char *>PyBytes_AS_STRING(ele), n)
    return out[:n]


def lp_append_entries(lp, head, eles, Py_ssize_t start, Py_ssize_t step, tail, Py_ssize_t added):
    """listpack.lp_append_entries, compiled: encodes straight into the buffer."""
    cdef Py_ssize_t n_eles, i, k, bound, old, pos, count, n
    cdef int64_t iv
    cdef unsigned char *p
    cdef list odd = None              # reference encodings of elements not encoded here, in order
    cdef object ele, enc
    if not (PyByteArray_CheckExact(lp) and PyBytes_CheckExact(head) and PyBytes_CheckExact(tail)
            and (PyList_CheckExact(eles) or PyTuple_CheckExact(eles)) and start >= 0 and step > 0 and added >= 0):
        return _pure().PURE_KERNELS["lp_append_entries"](lp, head, eles, start, step, tail, added)
    n_eles = len(eles)
    # Pass 1: bound the bytes, and let the reference encode (or refuse) what is not ours,
    # so that every error is raised before the buffer changes, as in the reference.
    bound = PyBytes_GET_SIZE(head) + PyBytes_GET_SIZE(tail)
    i = start
    while i < n_eles:
        ele = eles[i]
        if _fast(ele, &iv):
            bound += (PyBytes_GET_SIZE(ele) + 10) if PyBytes_CheckExact(ele) else 10
        else:
            enc = _pure()._lp_encode_py(ele)
            if odd is None:
                odd = []
            odd.append(enc)
            bound += PyBytes_GET_SIZE(enc)
        i += step
    old = PyByteArray_GET_SIZE(lp)
    count = (<unsigned char *>PyByteArray_AS_STRING(lp))[4] | ((<unsigned char *>PyByteArray_AS_STRING(lp))[5] << 8)
    PyByteArray_Resize(lp, old + bound)
    p = <unsigned char *>PyByteArray_AS_STRING(lp)
    pos = old - 1                                 # over the terminator
    n = PyBytes_GET_SIZE(head)
    memcpy(p + pos, PyBytes_AS_STRING(head), n)
    pos += n
    i = start
    k = 0
    while i < n_eles:
        ele = eles[i]
        if _fast(ele, &iv):
            if PyLong_CheckExact(ele):
                pos += _put_int(p + pos, iv)
            else:
                pos += _put_bytes(p + pos, <const unsigned char *>PyBytes_AS_STRING(ele), PyBytes_GET_SIZE(ele))
        else:
            enc = odd[k]
            k += 1
            n = PyBytes_GET_SIZE(enc)
            memcpy(p + pos, PyBytes_AS_STRING(enc), n)
            pos += n
        i += step
    n = PyBytes_GET_SIZE(tail)
    memcpy(p + pos, PyBytes_AS_STRING(tail), n)
    pos += n
    p[pos] = 0xFF
    pos += 1
    if <uint64_t>pos > UINT32_MAX:
        PyByteArray_Resize(lp, old)
        (<unsigned char *>PyByteArray_AS_STRING(lp))[old - 1] = 0xFF
        invariant(False, "listpack over 4 GiB")
    PyByteArray_Resize(lp, pos)
    if count != NUMELE_UNKNOWN:
        count = min(count + added, NUMELE_UNKNOWN)
    p = <unsigned char *>PyByteArray_AS_STRING(lp)
    p[0] = <unsigned char>(pos & 0xFF)
    p[1] = <unsigned char>((pos >> 8) & 0xFF)
    p[2] = <unsigned char>((pos >> 16) & 0xFF)
    p[3] = <unsigned char>((pos >> 24) & 0xFF)
    p[4] = <unsigned char>(count & 0xFF)
    p[5] = <unsigned char>((count >> 8) & 0xFF)


# ---------------------------------------------------------------- stream node check
# stream.py `_check_node` (the reference) validates a stream node's listpack deep and its
# stream layout when a stream is loaded (a snapshot, a slot move's pre-copy, a restart).
# This twin decides only "valid, with this live count" or "not valid" (-1): on -1 the
# caller runs the reference, which raises the reference's own error, so every message
# stays the pure code's. tests/kernels/test_stream_node_kernel.py compares both.

cdef inline int _lp_entry(const unsigned char *d, Py_ssize_t p, Py_ssize_t end,
                          Py_ssize_t *length, Py_ssize_t *head) noexcept:
    """The entry at p: its forward length (encoding + data) and its encoding bytes; -1 if
    the encoding is bad or runs past `end` (listpack.py lp_validate's rules)."""
    cdef unsigned char b = d[p]
    cdef uint64_t n32
    if b < 0x80:
        head[0] = 1; length[0] = 1
    elif b < 0xC0:
        head[0] = 1; length[0] = 1 + (b & 0x3F)
    elif b < 0xE0:
        head[0] = 1; length[0] = 2
    elif b < 0xF0:
        head[0] = 2
        if p + 2 > end:
            return -1
        length[0] = 2 + (((b & 0x0F) << 8) | d[p + 1])
    elif b == 0xF0:
        head[0] = 5
        if p + 5 > end:
            return -1
        n32 = (<uint64_t>d[p + 1]) | (<uint64_t>d[p + 2] << 8) | (<uint64_t>d[p + 3] << 16) \
            | (<uint64_t>d[p + 4] << 24)
        if n32 > <uint64_t>end:          # cannot fit: and keeps the sum below in range
            return -1
        length[0] = 5 + <Py_ssize_t>n32
    elif b == 0xF1:
        head[0] = 1; length[0] = 3
    elif b == 0xF2:
        head[0] = 1; length[0] = 4
    elif b == 0xF3:
        head[0] = 1; length[0] = 5
    elif b == 0xF4:
        head[0] = 1; length[0] = 9
    else:                                # 0xF5-0xFE, or the terminator before the end
        return -1
    if p + head[0] > end:
        return -1
    return 0


cdef inline Py_ssize_t _backlen_len(Py_ssize_t length) noexcept:
    if length <= 127:
        return 1
    if length < 16383:
        return 2
    if length < 2097151:
        return 3
    if length < 268435455:
        return 4
    return 5


cdef inline bint _backlen_ok(const unsigned char *d, Py_ssize_t q, Py_ssize_t bl, Py_ssize_t length) noexcept:
    """The bl bytes ending before q are exactly lpEncodeBacklen(length)."""
    cdef Py_ssize_t i
    cdef uint64_t v = <uint64_t>length
    cdef unsigned char want
    for i in range(bl - 1, -1, -1):
        want = (v & 127) | (0x80 if i else 0)
        if d[q - bl + i] != want:
            return False
        v >>= 7
    return True


cdef inline bint _lp_int(const unsigned char *d, Py_ssize_t p, int64_t *out) noexcept:
    """The element at p as an int (lp_decode_all's values); False for a string."""
    cdef unsigned char b = d[p]
    cdef uint64_t u = 0
    cdef int w, i
    if b < 0x80:
        out[0] = b
        return True
    if b < 0xC0:
        return False
    if b < 0xE0:
        u = ((b & 0x1F) << 8) | d[p + 1]
        out[0] = <int64_t>u - 8192 if u >= 4096 else <int64_t>u
        return True
    if b <= 0xF0:
        return False
    w = 2 if b == 0xF1 else 3 if b == 0xF2 else 4 if b == 0xF3 else 8
    for i in range(w - 1, -1, -1):
        u = (u << 8) | d[p + 1 + i]
    if w < 8 and (u >> (8 * w - 1)) & 1:          # sign-extend
        u |= ~((<uint64_t>1 << (8 * w)) - 1)
    out[0] = <int64_t>u
    return True


def check_stream_node(lp, Py_ssize_t max_bytes):
    """Live entry count of a valid stream node listpack (stream.py `_check_node`'s rules),
    or -1 when the reference must look (anything not valid, or not exact bytes)."""
    if not PyBytes_CheckExact(lp):
        return -1
    cdef const unsigned char *d = <const unsigned char *>PyBytes_AS_STRING(lp)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(lp)
    cdef Py_ssize_t end, p, q, length = 0, head = 0, bl, count = 0, n, i, k
    cdef uint64_t total
    cdef unsigned int numele
    if size < 7 or size > max_bytes:
        return -1
    total = (<uint64_t>d[0]) | (<uint64_t>d[1] << 8) | (<uint64_t>d[2] << 16) | (<uint64_t>d[3] << 24)
    numele = d[4] | (d[5] << 8)
    end = size - 1
    if total != <uint64_t>size or d[end] != 0xFF:
        return -1
    # Pass 1: lp_validate(deep=True), counting the elements.
    p = 6
    while p < end:
        if _lp_entry(d, p, end, &length, &head) < 0:
            return -1
        bl = _backlen_len(length)
        q = p + length + bl
        if q > end or not _backlen_ok(d, q, bl, length):
            return -1
        p = q
        count += 1
    if numele != NUMELE_UNKNOWN and numele != count:
        return -1
    # Pass 2: the stream layout over the elements (offsets first: the checks look ahead).
    n = count
    if n < 4:
        return -1
    cdef Py_ssize_t *off = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
    if off == NULL:
        raise MemoryError()
    try:
        p = 6
        for i in range(n):
            off[i] = p
            _lp_entry(d, p, end, &length, &head)
            p += length + _backlen_len(length)
        return _stream_layout(d, off, n)
    finally:
        PyMem_Free(off)


cdef Py_ssize_t _stream_layout(const unsigned char *d, const Py_ssize_t *off, Py_ssize_t n) noexcept:
    cdef int64_t cnt, deleted, nmf, flags, msd, seqd, nf, v
    cdef Py_ssize_t i, k, want, live = 0, dead = 0
    if not (_lp_int(d, off[0], &cnt) and _lp_int(d, off[1], &deleted) and _lp_int(d, off[2], &nmf)):
        return -1
    if cnt < 0 or deleted < 0 or nmf < 0:
        return -1
    if nmf < 1 or (cnt == 0 and deleted == 0) or nmf > n - 4:
        return -1
    if not _lp_int(d, off[3 + nmf], &v) or v != 0:
        return -1
    i = 4 + <Py_ssize_t>nmf
    while i < n:
        if i + 3 > n:
            return -1
        if not (_lp_int(d, off[i], &flags) and _lp_int(d, off[i + 1], &msd) and _lp_int(d, off[i + 2], &seqd)):
            return -1
        if flags < 0 or flags > 3:
            return -1
        if live + dead == 0 and (msd != 0 or seqd != 0):
            return -1
        if flags & 2:                                  # FLAG_SAMEFIELDS
            k = i + 3 + <Py_ssize_t>nmf
            want = 3 + <Py_ssize_t>nmf
        else:
            if i + 3 >= n or not _lp_int(d, off[i + 3], &nf) or nf < 1:
                return -1
            if nf > n:                                 # k would be past the end (and no overflow)
                return -1
            k = i + 4 + 2 * <Py_ssize_t>nf
            want = 4 + 2 * <Py_ssize_t>nf
        if k >= n or not _lp_int(d, off[k], &v) or v != want:
            return -1
        if flags & 1:                                  # FLAG_DELETED
            dead += 1
        else:
            live += 1
        i = k + 1
    if live != cnt or dead != deleted:
        return -1
    return live
