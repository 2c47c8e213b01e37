"""Peer authentication: the HMAC handshake of the peer protocol (proto/xraft/v1/peer.proto).

Every node of a cluster holds the same shared secret (never sent on the wire).
The dialler opens a Peer.Stream; three Hellos follow, each signed with

    proof = HMAC-SHA256(secret, "xraft-peer-v2\\0" || role || cluster_id || "\\0" ||
            u64be(node_id) || u64be(peer_node_id) || u64be(unix_ms) ||
            u8(len) nonce || u8(len) reply_to_nonce || u8(len) incarnation)

  1. dialler -> acceptor  role DIAL:    a fresh nonce Nd
  2. acceptor -> dialler  role ACCEPT:  a fresh nonce Na, reply_to_nonce = Nd
  3. dialler -> acceptor  role CONFIRM: reply_to_nonce = Na

so a process without the secret can neither open a stream to a node nor pose
as the node a dialler meant to reach: nothing it sends is ever voted on or
appended. Replays are stopped by challenge and response on both sides, with no
clock involved: each side accepts the other only once it has signed that
side's fresh nonce (2 for the dialler, 3 for the acceptor), so a Hello captured
from another handshake proves nothing, now or later, and two nodes whose
clocks are minutes or days apart still connect. (Version 1 checked unix_ms
against a 30 s window instead, which cut nodes with skewed clocks off the
cluster.) unix_ms is still sent and signed; the role byte keeps one step's
proof from standing in for another's, the length prefixes keep two nonce
splits from signing alike.

Peer clocks. No check depends on unix_ms, but the handshake is where a node
reads its peers' clocks (PeerClocks): the acceptor's answer (step 2) and the
dialler's confirmation (step 3) are each signed over a nonce the reader drew
moments before, so their unix_ms was read by the peer within one round trip
of their receipt. The leader caps replicated time by these readings
(fsm/resolve.py TimeStamper.cap_by_group). Step 1 is not fresh (it may be a
replay) and is not read.

Each Hello also carries the sender's incarnation (incarnation.py: 16 random
bytes drawn when its data dir was bootstrapped). Once the other side is
proven fresh, check_incarnation(node_id, incarnation) runs: a node id that
comes back with a different incarnation lost its disk and is refused.

What this does NOT give without TLS: confidentiality, or protection against an
on-path attacker who lets the handshake through and then injects frames into
the plaintext TCP stream. Configure TLS (grpc_transport.TlsConfig) when the
network between nodes is not trusted.

This module is transport-free (hashlib/hmac, a wall and a monotonic clock for
unix_ms and its readings, os.urandom): the gRPC plumbing lives in grpc_transport.py and maps
HelloRefused.code onto a gRPC status.
"""
from __future__ import annotations

import enum
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

PROTOCOL_VERSION = 2
DOMAIN = b"xraft-peer-v2\x00"
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
INCARNATION_BYTES = 16
ROLE_DIAL, ROLE_ACCEPT, ROLE_CONFIRM = b"D", b"A", b"C"  # which step of the handshake a proof signs
MAX_PEER_CLOCKS = 1024  # clock readings kept, one per peer node id (the oldest goes first beyond it)
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
    UNAUTHENTICATED = "UNAUTHENTICATED"  # bad proof, an answer to another handshake's nonce
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # other cluster, protocol version, wrong/unknown node,
    #                                             a node id back with another incarnation
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # a malformed Hello (field sizes)
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the incarnation book is full


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


def compute_proof(secret: bytes, cluster_id: bytes, role: bytes, node_id: int, peer_node_id: int,
                  unix_ms: int, nonce: bytes, reply_to_nonce: bytes, incarnation: bytes) -> bytes:
    # Every variable-length field is length-prefixed (each is <= 64 bytes, checked before this).
    msg = b"".join((DOMAIN, role, cluster_id, b"\x00", _U64.pack(node_id), _U64.pack(peer_node_id),
                    _U64.pack(unix_ms), bytes((len(nonce),)), nonce, bytes((len(reply_to_nonce),)),
                    reply_to_nonce, bytes((len(incarnation),)), incarnation))
    return hmac.new(secret, msg, hashlib.sha256).digest()


# ---------------------------------------------------------------- the handshake


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class PeerClocks:
    """The last fresh clock reading of each peer: its signed unix_ms against our
    monotonic clock at receipt. Kept that way, not as a skew against our wall
    clock, so that a step of our own wall clock after the reading does not
    shift what we believe of the peer's: skews() extrapolates each peer's clock
    at monotonic speed and compares it with our wall clock now. A reconnect
    refreshes a peer's reading; readings are not aged otherwise (clocks drift
    slowly, and a peer whose clock is stepped reconnects rarely, so a stale
    reading is one vote of a median, see TimeStamper.cap_by_group)."""

    def __init__(self, limit: int = MAX_PEER_CLOCKS):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        # Invariant: node id -> (peer unix_ms - our monotonic ms at receipt); <= limit entries,
        # in the order they were last read (a refresh moves its entry last).
        self._offsets: dict[int, int] = {}

    def record(self, node_id: int, unix_ms: int, mono_ms: int) -> None:
        self._offsets.pop(node_id, None)
        if len(self._offsets) >= self.limit:
            del self._offsets[next(iter(self._offsets))]
        self._offsets[node_id] = unix_ms - mono_ms

    def forget(self, node_id: int) -> None:
        self._offsets.pop(node_id, None)

    def skews(self, wall_ms: int, mono_ms: int) -> dict[int, int]:
        """{node id: its clock minus our wall clock `wall_ms`}, now (at monotonic `mono_ms`)."""
        return {n: off + mono_ms - wall_ms for n, off in self._offsets.items()}


def _accept_any_incarnation(_node_id: int, _incarnation: bytes) -> None:
    return None


class PeerAuthenticator:
    """One node's side of the handshake: makes its Hellos and checks the peers'.

    `known_node` decides which node ids may connect (the node's current peer set);
    `incarnation` is this node's (16 bytes; a random one when not given: an
    in-memory node is a new incarnation every time); `check_incarnation` raises
    HelloRefused for a peer's incarnation it refuses (PeerIncarnations.check),
    and runs only on a Hello proven fresh; `clock_ms` feeds unix_ms and, with
    `mono_ms`, the peers' clock readings (`peer_clocks`): no check depends on
    either, so tests inject skewed clocks to show exactly that.
    """

    def __init__(self, node_id: int, cluster_id: str, secret: bytes, *,
                 known_node: Callable[[int], bool],
                 incarnation: Optional[bytes] = None,
                 check_incarnation: Callable[[int, bytes], None] = _accept_any_incarnation,
                 max_envelope_bytes: int = MAX_ENVELOPE_BYTES,
                 advertise_address: str = "",
                 clock_ms: Callable[[], int] = _wall_ms,
                 mono_ms: Callable[[], int] = _mono_ms):
        if not 0 < node_id <= _MAX_U64:
            raise ValueError(f"node id {node_id} must be > 0")
        if len(secret) < MIN_SECRET_BYTES:
            raise SecretError(f"peer secret is {len(secret)} bytes; at least {MIN_SECRET_BYTES} are needed")
        if not MIN_ENVELOPE_BYTES <= max_envelope_bytes <= MAX_ENVELOPE_BYTES:
            raise ValueError(f"max_envelope_bytes must be in [{MIN_ENVELOPE_BYTES}, {MAX_ENVELOPE_BYTES}]")
        if len(advertise_address.encode()) > MAX_ADVERTISE_BYTES:
            raise ValueError("advertise address over 256 bytes")
        incarnation = os.urandom(INCARNATION_BYTES) if incarnation is None else bytes(incarnation)
        if len(incarnation) != INCARNATION_BYTES:
            raise ValueError(f"incarnation must be {INCARNATION_BYTES} bytes")
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._cluster = check_cluster_id(cluster_id)
        self._secret = bytes(secret)
        self.known_node = known_node
        self.incarnation = incarnation
        self.check_incarnation = check_incarnation
        self.max_envelope_bytes = max_envelope_bytes
        self.advertise_address = advertise_address
        self.clock_ms = clock_ms
        self.mono_ms = mono_ms
        self.peer_clocks = PeerClocks()

    def _hello(self, role: bytes, peer_node_id: int, nonce: bytes, reply_to_nonce: bytes) -> peer_pb2.Hello:
        now = max(0, min(_MAX_U64, int(self.clock_ms())))
        return peer_pb2.Hello(
            protocol_version=PROTOCOL_VERSION, cluster_id=self.cluster_id, node_id=self.node_id,
            peer_node_id=peer_node_id, unix_ms=now, nonce=nonce, reply_to_nonce=reply_to_nonce,
            incarnation=self.incarnation,
            proof=compute_proof(self._secret, self._cluster, role, self.node_id, peer_node_id, now, nonce,
                                reply_to_nonce, self.incarnation),
            max_envelope_bytes=self.max_envelope_bytes, advertise_address=self.advertise_address)

    # -- step 1 (dialler) and its check (acceptor)

    def dialler_hello(self, peer_node_id: int) -> peer_pb2.Hello:
        """The first frame of a stream this node opens to `peer_node_id`."""
        return self._hello(ROLE_DIAL, peer_node_id, os.urandom(NONCE_BYTES), b"")

    def check_dialler_hello(self, h: peer_pb2.Hello) -> None:
        """Acceptor side, step 1. Raises HelloRefused. Passing proves only that a secret
        holder made `h` at some time: the stream is trusted after check_dialler_confirm()."""
        if h.reply_to_nonce:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, "a dialler's Hello has a reply_to_nonce")
        if not self.known_node(h.node_id):
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION, f"node {h.node_id} is not a peer of this node")
        self._check_common(h, ROLE_DIAL)

    # -- step 2 (acceptor) and its check (dialler)

    def acceptor_hello(self, their: peer_pb2.Hello) -> peer_pb2.Hello:
        """Our answer to a dialler's Hello that check_dialler_hello() accepted: our fresh
        nonce, the challenge the dialler must sign in step 3."""
        return self._hello(ROLE_ACCEPT, their.node_id, os.urandom(NONCE_BYTES), their.nonce)

    def check_acceptor_hello(self, h: peer_pb2.Hello, mine: peer_pb2.Hello) -> None:
        """Dialler side: `h` answers our Hello `mine` (sent to mine.peer_node_id)."""
        if h.node_id != mine.peer_node_id:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"dialled node {mine.peer_node_id}, node {h.node_id} answered")
        # Bound to our fresh nonce: an acceptor Hello recorded elsewhere cannot be replayed to us.
        if not hmac.compare_digest(h.reply_to_nonce, mine.nonce):
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, "the answer does not reply to our nonce")
        self._check_common(h, ROLE_ACCEPT)
        self.check_incarnation(h.node_id, h.incarnation)  # fresh and authentic: now it may teach us
        self.peer_clocks.record(h.node_id, h.unix_ms, self.mono_ms())   # made after our nonce: fresh

    # -- step 3 (dialler) and its check (acceptor)

    def dialler_confirm(self, theirs: peer_pb2.Hello, mine: peer_pb2.Hello) -> peer_pb2.Hello:
        """Step 3: our signature over the acceptor's nonce (after check_acceptor_hello(theirs, mine))."""
        return self._hello(ROLE_CONFIRM, mine.peer_node_id, mine.nonce, theirs.nonce)

    def check_dialler_confirm(self, h: peer_pb2.Hello, first: peer_pb2.Hello, answer: peer_pb2.Hello) -> None:
        """Acceptor side, step 3: `h` must be signed by the dialler of `first` over our
        nonce in `answer`. Only now is the dialler proven live: a replayed step 1 stops here."""
        if h.node_id != first.node_id or h.incarnation != first.incarnation:
            raise HelloRefused(RefusalCode.FAILED_PRECONDITION,
                               f"node {first.node_id} opened the handshake, node {h.node_id} confirmed it")
        if not hmac.compare_digest(h.reply_to_nonce, answer.nonce):
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, "the confirmation does not reply to our nonce")
        self._check_common(h, ROLE_CONFIRM)
        self.check_incarnation(h.node_id, h.incarnation)
        self.peer_clocks.record(h.node_id, h.unix_ms, self.mono_ms())   # made after our nonce: fresh

    def peer_clock_skews(self) -> dict[int, int]:
        """{peer node id: its clock minus ours, in ms}, from each peer's last handshake."""
        return self.peer_clocks.skews(int(self.clock_ms()), int(self.mono_ms()))

    def _check_common(self, h: peer_pb2.Hello, role: bytes) -> None:
        """Checks every Hello gets, cheapest first; the HMAC comes last."""
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
        if len(h.reply_to_nonce) > MAX_NONCE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"reply_to_nonce of {len(h.reply_to_nonce)} bytes")
        if len(h.incarnation) != INCARNATION_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"incarnation of {len(h.incarnation)} bytes")
        if len(h.proof) != PROOF_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"proof of {len(h.proof)} bytes")
        if len(h.advertise_address.encode()) > MAX_ADVERTISE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, "advertise address over 256 bytes")
        env = h.max_envelope_bytes
        if env and not MIN_ENVELOPE_BYTES <= env <= MAX_ENVELOPE_BYTES:
            raise HelloRefused(RefusalCode.INVALID_ARGUMENT, f"max_envelope_bytes {env} out of range")
        expected = compute_proof(self._secret, self._cluster, role, h.node_id, h.peer_node_id, h.unix_ms,
                                 h.nonce, h.reply_to_nonce, h.incarnation)
        # Constant time: a byte-by-byte compare would leak how much of a forged proof is right.
        if not hmac.compare_digest(expected, h.proof):
            raise HelloRefused(RefusalCode.UNAUTHENTICATED, f"bad proof from node {h.node_id} (wrong secret?)")

    @staticmethod
    def envelope_limit(h: peer_pb2.Hello) -> int:
        """The largest PeerEnvelope the sender of `h` accepts."""
        return h.max_envelope_bytes or MAX_ENVELOPE_BYTES
