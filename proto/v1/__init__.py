"""xraft's protobuf API, version 1 (protobuf package `xraft.v1`).

    client_pb2, client_pb2_grpc   the public client API (service XRaft)
    peer_pb2, peer_pb2_grpc       node-to-node Raft transport (service Peer)

Those modules are generated from ../xraft/v1/*.proto by xraft.proto.codegen at
install time and are not in git. Importing this package first checks that they
match the .proto files, and regenerates them if not (or fails, if grpcio-tools
is missing), so an edited .proto can never be masked by stale generated code.
"""
from xraft.proto import codegen as _codegen

_codegen.ensure_fresh()
