"""Node incarnations: who a node id was the last time we talked to it.

An incarnation is 16 random bytes a node draws once, when it bootstraps its
data dir (node_main writes it into the identity file), and sends in every
peer Hello (peer_auth). A node id that comes back with another incarnation
is the same id on a different disk: a wiped or replaced data dir. Letting it
vote would be the classic Raft amnesia (it forgot its votes and its log, so a
committed entry can lose its majority), so its peers refuse it.

PeerIncarnations is the peer side's memory of that: node id -> incarnation,
persisted in the data dir (peer-incarnations.json) before the first
handshake that taught it is accepted, so a restart of the peer does not
forget it either. A legitimately replaced node must come back through a
membership change (remove the old id, add the new one), which must also
forget its entry (forget()).

write_durably() is the one crash-safe file write both files use: the bytes go
to a temporary file, are fsynced, renamed over the target, and the directory
is fsynced; a crash at any point leaves the old file or the new one, whole.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional

from .peer_auth import INCARNATION_BYTES, HelloRefused, RefusalCode
from .wal import fsync_dir

log = logging.getLogger("xraft.incarnation")

PEER_INCARNATIONS_FILE = "peer-incarnations.json"
MAX_FILE_BYTES = 1 << 20
MAX_PEERS = 4096  # node ids ever seen; far beyond any group (config MAX_NODES is 64)
_NO_HOOK: Callable[[str], None] = lambda _step: None


def new_incarnation() -> bytes:
    return os.urandom(INCARNATION_BYTES)


def write_durably(path: str, data: bytes, crash_hook: Callable[[str], None] = _NO_HOOK) -> None:
    """Replace `path` by `data` atomically and durably (tmp, fsync, rename, fsync dir).

    crash_hook(step) runs after each step ("written", "synced", "renamed",
    "dir-synced"): the crash tests kill the process there.
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        crash_hook("written")
        os.fsync(fd)
        crash_hook("synced")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    crash_hook("renamed")
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    crash_hook("dir-synced")


def read_small_file(path: str, limit: int = MAX_FILE_BYTES) -> Optional[bytes]:
    """The file's bytes, None if it does not exist; ValueError if over `limit` bytes.
    A leftover path + ".tmp" (a crash before the rename) is never read: it was not committed."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        return None
    if len(raw) > limit:
        raise ValueError(f"{path} is over {limit} bytes")
    return raw


def parse_incarnation(text, what: str) -> bytes:
    """A hex incarnation from a file; ValueError unless it is exactly INCARNATION_BYTES."""
    if not isinstance(text, str):
        raise ValueError(f"{what}: incarnation is not a string")
    inc = bytes.fromhex(text)
    if len(inc) != INCARNATION_BYTES:
        raise ValueError(f"{what}: incarnation of {len(inc)} bytes, not {INCARNATION_BYTES}")
    return inc


class PeerIncarnations:
    """node id -> the incarnation this node accepted for it; durable before it is relied on.

    check() is the handshake's hook (PeerAuthenticator(check_incarnation=...)):
    first sight of a node id records its incarnation (written durably before
    the handshake completes); a different one later is refused, with an ERROR
    line that says what happened and what to do. It runs on the transport's
    event loop: the fsync'd write happens once per peer ever, not per handshake.
    Limitation: a node id never seen before its disk was wiped cannot be told
    apart from a new one; every peer meets every voter within a few ticks of
    the cluster's first start, which closes that window in practice.
    """

    def __init__(self, path: str, crash_hook: Callable[[str], None] = _NO_HOOK):
        self.path = path
        self._crash_hook = crash_hook
        # Invariant: every value is INCARNATION_BYTES long; len(self._known) <= MAX_PEERS;
        # what is in memory is what the file holds (written before it is added here).
        self._known: dict[int, bytes] = {}
        raw = read_small_file(path)
        if raw is not None:
            self._known = self._parse(raw)

    def _parse(self, raw: bytes) -> dict[int, bytes]:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(doc.get("peers"), dict):
                raise ValueError("not a version 1 peer incarnation file")
            peers = doc["peers"]
            if len(peers) > MAX_PEERS:
                raise ValueError(f"{len(peers)} peers (limit {MAX_PEERS})")
            out = {}
            for k, v in peers.items():
                nid = int(k)
                if not 0 < nid < 1 << 64:
                    raise ValueError(f"node id {k!r}")
                out[nid] = parse_incarnation(v, f"node {nid}")
            return out
        except (ValueError, TypeError) as exc:
            raise ValueError(f"unreadable {self.path}: {exc}") from None

    def get(self, node_id: int) -> Optional[bytes]:
        return self._known.get(node_id)

    def _save(self, known: dict[int, bytes]) -> None:
        doc = {"version": 1, "peers": {str(k): v.hex() for k, v in sorted(known.items())}}
        write_durably(self.path, json.dumps(doc, indent=1).encode() + b"\n", self._crash_hook)

    def check(self, node_id: int, incarnation: bytes) -> None:
        """Accept `incarnation` for `node_id` (recording it on first sight) or raise HelloRefused."""
        known = self._known.get(node_id)
        if known == incarnation:
            return
        if known is not None:
            msg = (f"node {node_id} came back with incarnation {incarnation.hex()}, but this node knows it as "
                   f"{known.hex()}: its data directory was wiped or replaced, so it has forgotten votes and "
                   f"log entries and must not vote. Refused. Re-add it through a membership change "
                   f"(remove node {node_id}, then add it back as a new member)")
            log.error("%s", msg)
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, msg)
        if len(self._known) >= MAX_PEERS:
            raise HelloRefused(RefusalCode.RESOURCE_EXHAUSTED,
                               f"{MAX_PEERS} node incarnations remembered already; node {node_id} refused")
        new = dict(self._known)
        new[node_id] = incarnation
        self._save(new)  # durable first: a restart must not forget what this handshake taught
        self._known = new
        log.info("first contact with node %d: incarnation %s remembered", node_id, incarnation.hex())

    def forget(self, node_id: int) -> None:
        """For a membership change that removed `node_id`: a later node of that id is a new member."""
        if node_id in self._known:
            new = dict(self._known)
            del new[node_id]
            self._save(new)
            self._known = new
