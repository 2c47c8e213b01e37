"""xraft's client SDK: `xraft.client.aio.Client` (asyncio, grpc.aio) and
`xraft.client.sync.Client` (the same client behind blocking calls).

Results are the dataclasses of `xraft.client.types`; failures are the typed
errors of `xraft.client.errors`. The client never imports the node.
"""
from . import errors, types
from .errors import UnknownOutcomeError, XRaftError
from .types import StreamEntry, StreamID

__all__ = ["errors", "types", "XRaftError", "UnknownOutcomeError", "StreamEntry", "StreamID"]
