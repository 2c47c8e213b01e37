"""Peer authentication: the HMAC Hello of the peer protocol (proto/xraft/v1/peer.proto).

Every node of a cluster holds the same shared secret (never sent on the wire).
The dialler opens a Peer.Stream and sends a Hello first; the acceptor checks it
and answers with its own Hello, which the dialler checks in turn. Each Hello
carries

    proof = HMAC-SHA256(secret, "xraft-peer-v1\\0" || cluster_id || "\\0" ||
            u64be(node_id) || u64be(peer_node_id) || u64be(unix_ms) ||
            nonce || reply_to_nonce)

so a process without the secret can neither open a stream to a node nor pose
as the node a dialler meant to reach: nothing it sends is ever voted on or
appended. Replays are stopped from both sides:

  * acceptor side: a dialler's Hello is accepted only if its clock reading is
    within `window_ms` of ours AND its nonce was not seen in that window (the
    NonceCache below remembers every accepted nonce until its Hello leaves the
    window, so a captured Hello can be replayed neither now nor later);
  * dialler side: the acceptor's Hello must carry the dialler's fresh nonce in
    reply_to_nonce, so an acceptor's Hello captured from another handshake
    proves nothing.

What this does NOT give without TLS: confidentiality, or protection against an
on-path attacker who lets the handshake through and then injects frames into
the plaintext TCP stream. Configure TLS (grpc_transport.TlsConfig) when the
network between nodes is not trusted.

This module is transport-free (hashlib/hmac, a clock, os.urandom): the gRPC
plumbing lives in grpc_transport.py and maps HelloRefused.code onto a gRPC
status.
"""
from __future__ import annotations

import enum
import heapq
import hmac
import hashlib
import logging
import os
import stat
import struct
import time
from typing import Callable, Optional

from ...proto.v1 import peer_pb2

log = logging.getLogger("xraft.peer_auth")

PROTOCOL_VERSION = 1
DOMAIN = b"xraft-peer-v1\x00"
DEFAULT_SECRET_ENV = "XRAFT_CLUSTER_SECRET"  # the name xraft-node's CLI documents
# The name this module used first. Still read (with a warning) when DEFAULT_SECRET_ENV is
# unset, so a deployment that exported it keeps starting; drop it in a later release.
DEPRECATED_SECRET_ENV = "XRAFT_PEER_SECRET"
MIN_SECRET_BYTES = 16  # below this an offline guess of the secret from one captured Hello gets cheap
MAX_SECRET_BYTES = 4096
MAX_CLUSTER_ID_BYTES = 128
NONCE_BYTES = 32  # what we send; peers may send 16..64
MIN_NONCE_BYTES, MAX_NONCE_BYTES = 16, 64
PROOF_BYTES = 32
MAX_ADVERTISE_BYTES = 256
DEFAULT_WINDOW_MS = 30_000
MAX_ENVELOPE_BYTES = 16 << 20  # the proto's default and maximum
MIN_ENVELOPE_BYTES = 2 << 20
_U64 = struct.Struct(">Q")
_MAX_U64 = (1 << 64) - 1


# ---------------------------------------------------------------- errors


class PeerAuthError(Exception):
    """Base of this module's errors."""


class SecretError(PeerAuthError):
    """The shared secret could not be loaded or is unusable (a configuration error)."""


class RefusalCode(enum.Enum):
    # Names follow the gRPC status the acceptor ends the call with (see peer.proto).
    UNAUTHENTICATED = "UNAUTHENTICATED"  # bad proof, stale clock, replayed nonce
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # other cluster, protocol version, wrong/unknown node
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # a malformed Hello (field sizes)
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the nonce cache is full of live entries


class HelloRefused(PeerAuthError):
    """A Hello failed a check; `code` says which kind, the message says why (for logs)."""

    def __init__(self, code: RefusalCode, reason: str):
        super().__init__(f"{code.value}: {reason}")
        self.code = code
        self.reason = reason


# ---------------------------------------------------------------- the secret


def load_secret(path: Optional[str] = None, env_var: str = DEFAULT_SECRET_ENV,
                environ: Optional[dict] = None) -> bytes:
    """The cluster's shared secret: the contents of `path` if given, else the
    environment variable `env_var` (for the default name, the deprecated
    $XRAFT_PEER_SECRET when it is unset, with a warning). Surrounding whitespace (a trailing newline
    from `echo > file`) is stripped. Raises SecretError when neither source
    yields at least MIN_SECRET_BYTES bytes; a node must not start without one,
    which is what keeps a misconfigured node from joining unauthenticated.
    """
    if path is not None:
        try:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                raw = f.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise SecretError(f"cannot read the peer secret file {path!r}: {exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            # Not fatal (containers often mount secrets 0644), but worth an operator's look.
            log.warning("peer secret file %s is readable by group/others (mode %o)", path, mode & 0o777)
        source = f"file {path!r}"
    else:
        env = os.environ if environ is None else environ
        value = env.get(env_var)
        if value is None and env_var == DEFAULT_SECRET_ENV:
            value = env.get(DEPRECATED_SECRET_ENV)
            if value is not None:
                log.warning("the peer secret comes from $%s, which is deprecated: set $%s instead",
                            DEPRECATED_SECRET_ENV, DEFAULT_SECRET_ENV)
                env_var = DEPRECATED_SECRET_ENV
        if value is None:
            raise SecretError(f"no peer secret: set ${env_var} or give a secret file")
        raw = value.encode() if isinstance(value, str) else bytes(value)
        source = f"${env_var}"
    if len(raw) > MAX_SECRET_BYTES:
        raise SecretError(f"peer secret from {source} is over {MAX_SECRET_BYTES} bytes")
    secret = raw.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"peer secret from {source} is {len(secret)} bytes; at least "
                          f"{MIN_SECRET_BYTES} are needed")
    return secret


def check_cluster_id(cluster_id: str) -> bytes:
    b = cluster_id.encode()
    # NUL terminates the cluster id inside the proof: one inside would make two ids sign alike.
    if not 1 <= len(b) <= MAX_CLUSTER_ID_BYTES or b"\x00" in b:
        raise ValueError(f"cluster id {cluster_id!r} must be 1..{MAX_CLUSTER_ID_BYTES} bytes without NUL")
    return b


def compute_proof(secret: bytes, cluster_id: bytes, node_id: int, peer_node_id: int, unix_ms: int,
                  nonce: bytes, reply_to_nonce: bytes) -> bytes:
    msg = b"".join((DOMAIN, cluster_id, b"\x00", _U64.pack(node_id), _U64.pack(peer_node_id),
                    _U64.pack(unix_ms), nonce, reply_to_nonce))
    return hmac.new(secret, msg, hashlib.sha256).digest()


# ---------------------------------------------------------------- replay protection


class NonceCache:
    """Nonces of accepted Hellos, each kept until its Hello's timestamp leaves the window.

    Bounded: at most `max_entries` live nonces. Only Hellos with a VALID proof are
    recorded (the check runs after the HMAC), so only a secret holder can fill it;
    when it is full of live entries a new Hello is refused (RESOURCE_EXHAUSTED)
    rather than evicting a live nonce, which would reopen a replay.
    """

    def __init__(self, max_entries: int = 65_536):
        if max_entries <= 0:
            raise ValueError("max_entries must be > 0")
        self.max_entries = max_entries
        self._expiry: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def _prune(self, now_ms: int) -> None:
        h = self._heap
        while h and h[0][0] < now_ms:
            _, nonce = heapq.heappop(h)
            self._expiry.pop(nonce, None)

    def check_and_add(self, nonce: bytes, expires_ms: int, now_ms: int) -> None:
        """Record `nonce` until `expires_ms`; HelloRefused if it is already live or the cache is full."""
        self._prune(now_ms)
        if nonce in self._expiry:
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, "replayed Hello (nonce already seen)")
        if len(self._expiry) >= self.max_entries:
            raise HelloRefused(RefusalCode.RESOURCE_EXHAUSTED, "too many handshakes in the replay window")
        self._expiry[nonce] = expires_ms
        heapq.heappush(self._heap, (expires_ms, nonce))


# ---------------------------------------------------------------- the handshake


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class PeerAuthenticator:
    """One node's side of the handshake: makes its Hellos and checks the peers'.

    `known_node` decides which node ids may connect (the node's current peer set);
    `clock_ms` is injectable so tests can model skewed and replayed clocks.
    """

    def __init__(self, node_id: int, cluster_id: str, secret: bytes, *,
                 known_node: Callable[[int], bool],
                 window_ms: int = DEFAULT_WINDOW_MS,
                 max_envelope_bytes: int = MAX_ENVELOPE_BYTES,
                 advertise_address: str = "",
                 nonce_cache: Optional[NonceCache] = None,
                 clock_ms: Callable[[], int] = _wall_ms):
        if not 0 < node_id <= _MAX_U64:
            raise ValueError(f"node id {node_id} must be > 0")
        if len(secret) < MIN_SECRET_BYTES:
            raise SecretError(f"peer secret is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed")
        if not MIN_ENVELOPE_BYTES <= max_envelope_bytes <= MAX_ENVELOPE_BYTES:
            raise ValueError(f"max_envelope_bytes must be in [{MIN_ENVELOPE_BYTES}, {MAX_ENVELOPE_BYTES}]")
        if len(advertise_address.encode()) > MAX_ADVERTISE_BYTES:
            raise ValueError("advertise address over 256 bytes")
        if window_ms <= 0:
            raise ValueError("window_ms must be > 0")
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._cluster = check_cluster_id(cluster_id)
        self._secret = bytes(secret)
        self.known_node = known_node
        self.window_ms = window_ms
        self.max_envelope_bytes = max_envelope_bytes
        self.advertise_address = advertise_address
        self.nonces = nonce_cache or NonceCache()
        self.clock_ms = clock_ms

    def _hello(self, peer_node_id: int, reply_to_nonce: bytes) -> peer_pb2.Hello:
        now = self.clock_ms()
        nonce = os.urandom(NONCE_BYTES)
        return peer_pb2.Hello(
            protocol_version=PROTOCOL_VERSION, cluster_id=self.cluster_id, node_id=self.node_id,
            peer_node_id=peer_node_id, unix_ms=now, nonce=nonce, reply_to_nonce=reply_to_nonce,
            proof=compute_proof(self._secret, self._cluster, self.node_id, peer_node_id, now, nonce,
                                reply_to_nonce),
            max_envelope_bytes=self.max_envelope_bytes, advertise_address=self.advertise_address)

    def dialler_hello(self, peer_node_id: int) -> peer_pb2.Hello:
        """The first frame of a stream this node opens to `peer_node_id`."""
        return self._hello(peer_node_id, b"")

    def acceptor_hello(self, their: peer_pb2.Hello) -> peer_pb2.Hello:
        """Our answer to a dialler's Hello that check_dialler_hello() accepted."""
        return self._hello(their.node_id, their.nonce)

    def _check_common(self, h: peer_pb2.Hello) -> None:
        """Checks every Hello gets, cheapest first; the HMAC and the clock come last."""
        if h.protocol_version != PROTOCOL_VERSION:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"protocol version {h.protocol_version}, this node speaks {PROTOCOL_VERSION}")
        if h.cluster_id != self.cluster_id:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"cluster {h.cluster_id[:MAX_CLUSTER_ID_BYTES]!r}, this is {self.cluster_id!r}")
        if h.peer_node_id != self.node_id:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"meant for node {h.peer_node_id}, this is node {self.node_id}")
        if h.node_id == self.node_id or h.node_id == 0:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, f"sender claims node id {h.node_id}")
        if not MIN_NONCE_BYTES <= len(h.nonce) <= MAX_NONCE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"nonce of {len(h.nonce)} bytes")
        if len(h.proof) != PROOF_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"proof of {len(h.proof)} bytes")
        if len(h.advertise_address.encode()) > MAX_ADVERTISE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, "advertise address over 256 bytes")
        env = h.max_envelope_bytes
        if env and not MIN_ENVELOPE_BYTES <= env <= MAX_ENVELOPE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"max_envelope_bytes {env} out of range")
        expected = compute_proof(self._secret, self._cluster, h.node_id, h.peer_node_id, h.unix_ms,
                                 h.nonce, h.reply_to_nonce)
        # Constant time: a byte-by-byte compare would leak how much of a forged proof is right.
        if not hmac.compare_digest(expected, h.proof):
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, f"bad proof from node {h.node_id} (wrong secret?)")
        # The clock is checked after the proof: a stranger learns nothing about our clock.
        skew = h.unix_ms - self.clock_ms()
        if abs(skew) > self.window_ms:
            raise HelloRefused(RefusalCode.UNAUTHENTICATED,
                               f"node {h.node_id}'s clock is {skew} ms off ours (window {self.window_ms} ms)")

    def check_dialler_hello(self, h: peer_pb2.Hello) -> None:
        """Acceptor side. Raises HelloRefused; on return the dialler is node h.node_id."""
        if h.reply_to_nonce:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, "a dialler's Hello has a reply_to_nonce")
        if not self.known_node(h.node_id):
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, f"node {h.node_id} is not a peer of this node")
        self._check_common(h)
        # Recorded only now, after the proof: strangers cannot fill the cache.
        self.nonces.check_and_add(h.nonce, h.unix_ms + self.window_ms, self.clock_ms())

    def check_acceptor_hello(self, h: peer_pb2.Hello, mine: peer_pb2.Hello) -> None:
        """Dialler side: `h` answers our Hello `mine` (sent to mine.peer_node_id)."""
        if h.node_id != mine.peer_node_id:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"dialled node {mine.peer_node_id}, node {h.node_id} answered")
        # Bound to our fresh nonce: an acceptor Hello recorded elsewhere cannot be replayed to us.
        if not hmac.compare_digest(h.reply_to_nonce, mine.nonce):
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, "the answer does not reply to our nonce")
        self._check_common(h)

    @staticmethod
    def envelope_limit(h: peer_pb2.Hello) -> int:
        """The largest PeerEnvelope the sender of `h` accepts."""
        return h.max_envelope_bytes or MAX_ENVELOPE_BYTES
