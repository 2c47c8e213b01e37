"""The simulated application: a tiny deterministic KV / append store fed by Raft.

Commands travel in NORMAL entry data as `kind|request_id|key|value` (ASCII; no
`|` in keys or values). The store is keyed by request id as well as by key:
a network that duplicates a forwarded MsgProp can put one request in the log
twice, and only its first occurrence may take effect (a real service does the
same with a client session table). Empty entries (a new leader's no-op) and
conf changes do not touch the store.

The store's identity is checked two ways: `chain` hashes every applied entry in
order (index, term, data), and `digest()` hashes the store itself; both are
carried in the snapshot, so a node restored from a snapshot continues the
same chain as one that applied every entry.
"""
from __future__ import annotations

import hashlib
import json
from typing import Optional

from xraft.node.raft.types import Entry

MAX_APPLIED_IDS = 100_000  # bound on the dedupe table; a run proposes far fewer requests
MAX_VALUE_LEN = 4096  # bound on one key's appended value (a run stays far below it)


def encode_command(kind: str, request_id: int, key: str, value: str) -> bytes:
    assert kind in ("put", "append") and "|" not in key and "|" not in value
    return f"{kind}|{request_id}|{key}|{value}".encode()


def decode_command(data: bytes) -> tuple[str, int, str, str]:
    kind, rid, key, value = data.decode().split("|", 3)
    return kind, int(rid), key, value


class KVStore:
    __slots__ = ("data", "applied_ids", "chain", "applied_index")

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.applied_ids: set[int] = set()  # request ids that took effect (dedupe + final check)
        self.chain = b"\x00" * 16  # running hash of every applied entry
        self.applied_index = 0

    def apply(self, e: Entry, is_command: bool) -> Optional[int]:
        """Apply entry `e` (index must be applied_index+1); the request id it carried, if any."""
        assert e.index == self.applied_index + 1, f"apply gap: {e.index} after {self.applied_index}"
        self.applied_index = e.index
        self.chain = hashlib.blake2b(self.chain + f"{e.index}/{e.term}/{int(e.type)}/".encode() + e.data,
                                     digest_size=16).digest()
        if not is_command or not e.data:
            return None
        kind, rid, key, value = decode_command(e.data)
        if rid in self.applied_ids:
            return rid  # a duplicate of a request that already took effect
        assert len(self.applied_ids) < MAX_APPLIED_IDS, "dedupe table over its bound"
        self.applied_ids.add(rid)
        if kind == "put":
            self.data[key] = value
        else:
            self.data[key] = self.data.get(key, "") + value
        assert len(self.data[key]) <= MAX_VALUE_LEN, f"value of {key} over its bound"
        return rid

    def digest(self) -> bytes:
        items = json.dumps(sorted(self.data.items())).encode()
        return hashlib.blake2b(self.chain + items, digest_size=16).digest()

    def serialize(self) -> bytes:
        return json.dumps({"data": self.data, "ids": sorted(self.applied_ids),
                           "chain": self.chain.hex(), "index": self.applied_index},
                          sort_keys=True).encode()

    @classmethod
    def restore(cls, blob: bytes) -> "KVStore":
        kv = cls()
        if not blob:
            return kv
        obj = json.loads(blob)
        kv.data = dict(obj["data"])
        kv.applied_ids = set(obj["ids"])
        kv.chain = bytes.fromhex(obj["chain"])
        kv.applied_index = obj["index"]
        return kv
