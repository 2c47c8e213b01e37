"""Redis Cluster key slots: CRC16-XMODEM(key or its {hash tag}) mod 16384.

Same function as redis 7.0 `keyHashSlot` (src/cluster.c) over `crc16`
(src/crc16.c: polynomial 0x1021, initial value 0, no reflection, no final XOR),
so a key lands in the slot a redis cluster client computes for it.

Hash tag rule: if the key has a '{' and, somewhere after that first '{', a '}',
and at least one byte lies between them, only those bytes are hashed; otherwise
the whole key is. Only the first '{' and the first '}' after it count
("{}{a}" hashes whole, "{{a}}" hashes "{a").
"""
import binascii

SLOT_COUNT = 16384          # Invariant: a power of two (slot = crc & (SLOT_COUNT - 1))


def crc16(data: bytes) -> int:
    """CRC16-XMODEM. binascii.crc_hqx is exactly that (CRC-CCITT, polynomial 0x1021,
    no reflection) when started from 0, and runs in C: the keyspace hashes every
    new key for its per-slot index (keyspace.py), so this is on the write path
    (tests/engine/test_slots.py checks it against redis and the catalogued value)."""
    return binascii.crc_hqx(data, 0)


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
