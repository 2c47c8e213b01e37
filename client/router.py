"""Keeps the client's routing table: fetched with ClusterLayout, refreshed in the background.

The first keyed call waits for one fetch from the seeds (`ensure`). The first
node that answers decides the mode:
  LAYOUT   it sent a layout: every keyed call routes by its key's slot (RouteTable).
  SINGLE   it answered UNIMPLEMENTED (a node from before sharding): one Raft
           group owns every slot; the client follows one leader and NOT_LEADER
           redirects, as it always did. A MOVED error (only sharded nodes send
           it) makes the router ask again.
  UNKNOWN  no node answered: calls route the SINGLE way meanwhile and each
           asks for a background fetch.
Refreshes (`refresh_soon`, after NOT_LEADER/MOVED, a connection failure or
CLUSTERDOWN) run in one background task, at most one fetch per
REFRESH_MIN_INTERVAL_S however many calls ask, and never block a call: the
error's own leader hint is used at once (RouteTable.note_leader). A fetch asks
the known nodes (then the seeds) in turn until one answers with a valid layout.
"""
import asyncio

import grpc

from .errors import NotSupportedError, UnavailableError, XRaftError, from_rpc_error
from .routing import Layout, LayoutError, RouteTable

UNKNOWN, LAYOUT, SINGLE = "unknown", "layout", "single"
LAYOUT_FETCH_TIMEOUT_S = 2.0      # per node asked: a paused node must not hold a call for long
REFRESH_MIN_INTERVAL_S = 0.2      # between background fetches


class Router:
    def __init__(self, seeds: list, call):
        """`call(address, timeout)`: the ClusterLayout RPC to one node (a
        coroutine returning the response or raising grpc.aio.AioRpcError)."""
        self._seeds = seeds
        self._call = call
        self.mode = UNKNOWN
        self.table: RouteTable | None = None
        self.fetches = 0                   # ClusterLayout RPCs sent (tests and stats)
        self._first: asyncio.Event | None = None   # set once the first fetch ended
        self._refresh: asyncio.Task | None = None
        self._again = False
        self._last_fetch = float("-inf")
        self._rotation = 0
        self._closed = False

    async def ensure(self, timeout: float | None) -> None:
        """Before a keyed call: the first one fetches, so that calls are routed
        by slot from the start; calls made meanwhile wait for that fetch."""
        if self.mode is not UNKNOWN:
            return
        if self._first is None:
            self._first = asyncio.Event()
            try:
                await self.fetch(timeout)
            except XRaftError:
                pass                       # UNKNOWN: this call routes the SINGLE way
            finally:
                self._first.set()
        elif not self._first.is_set():
            await self._first.wait()
        else:
            self.refresh_soon()

    async def fetch(self, timeout: float | None) -> Layout:
        """Ask nodes in turn for the layout; install and return the first
        valid one. NotSupportedError if a node answered UNIMPLEMENTED and none
        sent a layout; the last error if none answered."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        known = self.table.addresses if self.table is not None else ()
        addresses = list(dict.fromkeys([*known, *self._seeds]))
        start = self._rotation
        self._rotation += 1
        last: XRaftError = UnavailableError("no node to ask for the cluster layout")
        unsupported = None
        for i in range(len(addresses)):
            address = addresses[(start + i) % len(addresses)]
            left = LAYOUT_FETCH_TIMEOUT_S if deadline is None else min(LAYOUT_FETCH_TIMEOUT_S, deadline - loop.time())
            if left <= 0:
                break
            self.fetches += 1
            try:
                layout = Layout.from_pb(await self._call(address, left))
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    unsupported = NotSupportedError(f"{address} does not serve ClusterLayout (a node without "
                                                    f"sharding): {e.details()}", grpc_code=e.code())
                    if self.mode is UNKNOWN:
                        break              # the first answer decides the mode (module doc)
                else:
                    last = from_rpc_error(e, write=False)
                continue
            except LayoutError as e:
                last = XRaftError(f"{address}: {e}", reason="INVALID_LAYOUT")
                continue
            self.install(layout)
            return layout
        if unsupported is not None:
            if self.mode is UNKNOWN:
                self.mode = SINGLE
            raise unsupported
        raise last

    def install(self, layout: Layout) -> None:
        if self.table is None:
            self.table = RouteTable(layout)
        else:
            self.table = self.table.updated(layout) or self.table
        self.mode = LAYOUT

    def refresh_soon(self) -> None:
        """Fetch the layout again in the background (rate-limited, coalesced)."""
        if self._closed or self.mode is SINGLE:
            return
        if self._refresh is not None and not self._refresh.done():
            self._again = True
            return
        self._refresh = asyncio.ensure_future(self._refresh_loop())

    def reprobe(self) -> None:
        """A SINGLE-mode client saw MOVED: the cluster is sharded now."""
        if self.mode is SINGLE:
            self.mode = UNKNOWN
            self.refresh_soon()

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            wait = self._last_fetch + REFRESH_MIN_INTERVAL_S - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._again = False
            self._last_fetch = loop.time()
            try:
                await self.fetch(None)
            except XRaftError:
                pass                       # the next error asks again
            if not self._again:
                return

    async def close(self) -> None:
        self._closed = True
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
