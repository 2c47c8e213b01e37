"""Configuration and counters of the gRPC peer transport (grpc_transport.py): TLS, limits, the
grpc channel and server options they imply, and the per-link and inbound statistics.

grpc_transport.py re-exports every public name here, so callers import them from either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import grpc

from .peer_auth import MAX_ENVELOPE_BYTES, MIN_ENVELOPE_BYTES

MAX_PROTO_BATCH_MESSAGES = 10_000  # RaftBatch.messages: 1..10000 (peer.proto)
_CHANNEL_RECEIVE_LIMIT = 4 << 20  # the acceptor sends us a Hello only


# ---------------------------------------------------------------- configuration


class TransportError(Exception):
    """Misuse of GrpcTransport (bad configuration, wrong life-cycle call)."""


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes. The same certificate serves this node's peer port and identifies it
    when it dials; `ca_certs` must sign every node's certificate."""

    cert_chain: bytes
    private_key: bytes
    ca_certs: bytes
    # Name checked in the peers' certificates instead of the dialled host (a cluster-wide
    # name in every node's certificate, when they are dialled by IP).
    server_name: Optional[str] = None
    # Mutual TLS on our server port. False: callers need only the CA (module doc: trade-off).
    require_client_cert: bool = True

    @classmethod
    def from_files(cls, cert_file: str, key_file: str, ca_file: str,
                   server_name: Optional[str] = None, require_client_cert: bool = True) -> "TlsConfig":
        def read(p: str) -> bytes:
            try:
                with open(p, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise TransportError(f"cannot read TLS file {p!r}: {exc}") from exc
        return cls(read(cert_file), read(key_file), read(ca_file), server_name, require_client_cert)

    def server_credentials(self) -> grpc.ServerCredentials:
        if not self.require_client_cert:
            # grpc then does not even request a client certificate (no root certificates
            # needed): TLS for confidentiality and server identity only.
            return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)])
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)],
                                           root_certificates=self.ca_certs, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca_certs, private_key=self.private_key,
                                            certificate_chain=self.cert_chain)


@dataclass(frozen=True)
class TransportLimits:
    max_envelope_bytes: int = MAX_ENVELOPE_BYTES  # largest envelope we accept (announced in our Hello)
    max_batch_messages: int = MAX_PROTO_BATCH_MESSAGES  # per envelope, both directions
    max_queued_bytes: int = 64 << 20  # per outgoing link: accepted by send(), not yet written
    max_queued_batches: int = 10_000  # per outgoing link
    handshake_timeout_s: float = 5.0  # dial + the three Hellos
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 5.0
    keepalive_s: float = 10.0  # HTTP/2 ping interval on an idle connection
    keepalive_timeout_s: float = 5.0  # no ping answer within this: the connection is dead
    max_pending_handshakes: int = 64  # inbound streams not yet past the Hello

    def validate(self) -> None:
        if not MIN_ENVELOPE_BYTES <= self.max_envelope_bytes <= MAX_ENVELOPE_BYTES:
            raise TransportError(f"max_envelope_bytes must be in [{MIN_ENVELOPE_BYTES}, {MAX_ENVELOPE_BYTES}]")
        if not 1 <= self.max_batch_messages <= MAX_PROTO_BATCH_MESSAGES:
            raise TransportError(f"max_batch_messages must be in [1, {MAX_PROTO_BATCH_MESSAGES}]")
        for name in ("max_queued_bytes", "max_queued_batches", "handshake_timeout_s", "backoff_initial_s",
                     "keepalive_s", "keepalive_timeout_s", "max_pending_handshakes"):
            if getattr(self, name) <= 0:
                raise TransportError(f"TransportLimits.{name} must be > 0")
        if self.backoff_max_s < self.backoff_initial_s:
            raise TransportError("backoff_max_s must be >= backoff_initial_s")


def server_options(limits: TransportLimits = TransportLimits()) -> list[tuple[str, object]]:
    """Options for the node's grpc.aio.Server that hosts the Peer service."""
    ka_ms = int(limits.keepalive_s * 1000)
    return [
        ("grpc.max_receive_message_length", limits.max_envelope_bytes),
        # A second process must not be able to bind the node's port next to it (Linux
        # SO_REUSEPORT would split incoming connections between the two).
        ("grpc.so_reuseport", 0),
        # Our peers ping every keepalive_s even without calls; a stricter server
        # would answer with GOAWAY "too_many_pings" and cut every link.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", max(ka_ms // 2, 1000)),
        ("grpc.http2.max_ping_strikes", 0),
        # And the server pings too: a dialler that vanished must not leave a half-open
        # inbound stream holding its slot forever.
        ("grpc.keepalive_time_ms", ka_ms),
        ("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout_s * 1000)),
    ]


def _channel_options(limits: TransportLimits, tls: Optional[TlsConfig]) -> list[tuple[str, object]]:
    opts: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", MAX_ENVELOPE_BYTES),
        ("grpc.max_receive_message_length", _CHANNEL_RECEIVE_LIMIT),
        ("grpc.keepalive_time_ms", int(limits.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),  # a Raft batch is never re-sent behind our back
        # Each dial gets its own channel and subchannel: gRPC's global subchannel pool
        # would otherwise hand us a connection still in its own (up to 120 s) backoff.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return opts


# ---------------------------------------------------------------- stats


@dataclass
class LinkStats:
    """One outgoing link (this node -> peer)."""

    connects: int = 0  # handshakes completed
    disconnects: int = 0  # established streams that broke
    handshake_failures: int = 0
    batches_accepted: int = 0  # send() returned True
    messages_accepted: int = 0
    envelopes_written: int = 0
    bytes_written: int = 0
    refused_down: int = 0  # send() while the link was not up
    refused_full: int = 0
    refused_oversize: int = 0
    batches_lost: int = 0  # reported through handler.unreachable()


@dataclass
class InboundStats:
    streams_accepted: int = 0
    hellos_refused: int = 0
    streams_superseded: int = 0
    protocol_errors: int = 0  # streams ended for a bad frame
    batches_delivered: int = 0
    messages_delivered: int = 0
    codec_errors: int = 0  # messages dropped


@dataclass
class TransportStats:
    inbound: InboundStats = field(default_factory=InboundStats)
    links: dict[int, LinkStats] = field(default_factory=dict)
