"""Redis Cluster key slots: CRC16-XMODEM(key or its {hash tag}) mod 16384.

Same function as redis 7.0 `keyHashSlot` (src/cluster.c) over `crc16`
(src/crc16.c: polynomial 0x1021, initial value 0, no reflection, no final XOR),
so a key lands in the slot a redis cluster client computes for it.

Hash tag rule: if the key has a '{' and, somewhere after that first '{', a '}',
and at least one byte lies between them, only those bytes are hashed; otherwise
the whole key is. Only the first '{' and the first '}' after it count
("{}{a}" hashes whole, "{{a}}" hashes "{a").
"""
SLOT_COUNT = 16384          # Invariant: a power of two (slot = crc & (SLOT_COUNT - 1))
_POLY = 0x1021


def _make_table() -> tuple:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ _POLY) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16_TABLE = _make_table()   # Invariant: _CRC16_TABLE[b] == crc16 of the single byte b


def crc16(data: bytes) -> int:
    """CRC16-XMODEM, table driven (one lookup per byte)."""
    crc = 0
    table = _CRC16_TABLE
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ b) & 0xFF]
    return crc


def hash_tag(key: bytes) -> bytes:
    """The part of `key` that decides its slot."""
    s = key.find(b"{")
    if s < 0:
        return key
    e = key.find(b"}", s + 1)
    if e < 0 or e == s + 1:
        return key
    return key[s + 1:e]


def key_slot(key: bytes) -> int:
    """The cluster slot of `key`, 0 <= slot < 16384."""
    return crc16(hash_tag(key)) & (SLOT_COUNT - 1)
