"""Redis Cluster key slots, the client's copy: CRC16-XMODEM(key or its {hash tag}) mod 16384.

The client may not import the node (import-linter), so this is a copy of
node/engine/slots.py; tests/client/test_routing_slots.py checks that the two agree
on arbitrary keys and that both give redis's known values.

redis 7.0 `keyHashSlot` (src/cluster.c) over `crc16` (src/crc16.c: polynomial
0x1021, initial value 0, no reflection, no final XOR). Hash tag rule: if the
key has a '{' and, after that first '{', a '}' with at least one byte between
them, only those bytes are hashed; otherwise the whole key is ("{}{a}" hashes
whole, "{{a}}" hashes "{a").
"""
SLOT_COUNT = 16384          # a power of two: slot = crc & (SLOT_COUNT - 1)


def _make_table() -> tuple:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_TABLE = _make_table()      # _TABLE[b] is the CRC16 of the single byte b


def crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ b) & 0xFF]
    return crc


def key_slot(key: bytes) -> int:
    """The cluster slot of `key` (bytes), 0 <= slot < 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc16(key) & (SLOT_COUNT - 1)
