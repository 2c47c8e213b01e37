"""The framing both snapshot formats share: a body followed by its CRC-32 (u32, big-endian).

    +------------------------------+------------+
    | body (starts with a header)  | crc32 u32  |   crc32 over the body only
    +------------------------------+------------+

stream_codec.py (a stream's record) and dump.py (the keyspace) check it the same way before
reading anything, each with its own error class and name in the messages.
"""
from __future__ import annotations

import struct
import zlib

_U32 = struct.Struct(">I")


def checked_body(buf, header_size: int, error: type, what: str) -> tuple:
    """(buf as bytes, where its body ends) once buf is bytes-like, holds at least the header
    plus 4 + 4 bytes, and its trailing CRC matches its body; else error("<what> ...")."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise error("%s is not bytes" % what)
    buf = bytes(buf)
    if len(buf) < header_size + 4 + 4:
        raise error("%s too short" % what)
    body_end = len(buf) - 4
    # A view, not a slice: a slice would copy the whole (up to state-sized) body once more.
    if zlib.crc32(memoryview(buf)[:body_end]) != _U32.unpack_from(buf, body_end)[0]:
        raise error("%s checksum mismatch" % what)
    return buf, body_end
