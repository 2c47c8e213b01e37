"""`xraft-health HOST:PORT`: exit 0 if the node there says SERVING (grpc.health.v1).

The container health check (ops/docker/Dockerfile) and anyone else without
grpc_health_probe. A node is SERVING while every Raft group it hosts knows a
leader (node_main); a node that is up but cut off from a quorum is NOT_SERVING,
so "healthy" means "can serve clients", not just "the process runs".

    exit 0  SERVING
    exit 1  NOT_SERVING, UNKNOWN, or no answer within --timeout (the reason on stderr)
    exit 2  bad arguments

Plain gRPC by default; --tls-ca FILE for a node started with --tls-*. The
health service needs no bearer token (only the XRaft client API does).
"""
import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

MAX_PEM_BYTES = 1 << 20


def check(address: str, timeout: float = 3.0, service: str = "", tls_ca: bytes | None = None) -> str:
    """The node's health status name (SERVING, NOT_SERVING, ...); raises grpc.RpcError if it does not answer."""
    channel = (grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls_ca))
               if tls_ca is not None else grpc.insecure_channel(address))
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    finally:
        channel.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="xraft-health", description="Exit 0 iff the xraft node is SERVING.")
    p.add_argument("address", metavar="HOST:PORT", help="the node's gRPC address")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer (default 3)")
    p.add_argument("--service", default="", help="health service name (default: the whole node)")
    p.add_argument("--tls-ca", metavar="FILE", help="PEM of the CA that signed the node (TLS)")
    args = p.parse_args(argv)
    ca = None
    if args.tls_ca:
        try:
            with open(args.tls_ca, "rb") as f:
                ca = f.read(MAX_PEM_BYTES)
        except OSError as exc:
            print(f"xraft-health: cannot read --tls-ca: {exc}", file=sys.stderr)
            return 2
    try:
        status = check(args.address, args.timeout, args.service, ca)
    except grpc.RpcError as exc:
        print(f"xraft-health: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    if status != "SERVING":
        print(f"xraft-health: {args.address}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
