"""xraft's client SDK: `xraft.client.aio.Client` (asyncio, grpc.aio) and
`xraft.client.sync.Client` (the same client behind blocking calls).

Results are the dataclasses of `xraft.client.types`; failures are the typed
errors of `xraft.client.errors`. Calls are routed by their key's slot to the
leader of the Raft group owning it (`slots`, `routing`, `router`: the layout
comes from the nodes' ClusterLayout RPC). The client never imports the node.
"""
from . import errors, types
from .errors import UnknownOutcomeError, XRaftError
from .types import StreamEntry, StreamID

__all__ = ["errors", "types", "XRaftError", "UnknownOutcomeError", "StreamEntry", "StreamID"]
