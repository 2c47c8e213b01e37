"""The steps of an online slot move that the data groups do, as calls the reconciler makes
(docs/slot-move-steps.md is the contract).

    reconciler --MoveSteps.seal/copy/verify/activate/release/abort--> any node
        --SlotMoveStep RPC (follows leader_grpc)--> the node leading the group
            SlotMoveRpcs.step: propose a SLOT_MOVE record, or read (export, manifest,
            staging) after a read index; answer refused / leader_grpc / unavailable
            in the response, so a caller needs no error-detail parsing

Every step is idempotent (the fsm makes the records so, fsm/slot_moves.py), so MoveSteps
retries freely: on a transport error, on NOT_LEADER (following the leader it names, else the
group's other voters), and on "unavailable" (no quorum, an outcome not known), until the step's
deadline. A step the fsm refuses raises MoveStepRefused with the fsm's text.

Failpoints (tests): XRAFT_FAILPOINT=after_<op>_<n> (op lowercase, e.g. after_stage_3) makes
the node kill itself (SIGKILL) right after its n-th successful <op> step as a leader: the
record is committed and applied here, the caller never hears the answer.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Callable, Optional

import grpc

from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

from ..engine.errors import EngineError
from ..fsm.entry import Kind, Request
from ..fsm.slot_export import (decode_have, export_chunk, live_digest, manifest, precopy_status, staged_have,
                               staging_status)
from ..fsm.slot_move_apply import move_argv
from ..fsm.slot_moves import END, KEYS_DONE, MAX_CHUNK_BYTES, MoveId, MoveRefused, encode_cursor
from .backend import BackendError, NotLeader

log = logging.getLogger("xraft.slot_move")

MAX_MESSAGE_BYTES = 16 << 20              # the gRPC service's limit (grpc_service.py)
STEP_TIMEOUT_S = 30.0                     # one step, retries included
RPC_TIMEOUT_S = 10.0                      # one attempt
RETRY_S = (0.02, 0.5)                     # backoff bounds between attempts
DEFAULT_CHUNK_BYTES = 1 << 20
PRECOPY_CHUNK_BYTES = 4 << 20            # bigger pieces tear less often while A serves
_WRITES = {"SEAL", "UNSEAL", "STAGE", "DROP_STAGING", "ACTIVATE", "RELEASE", "PURGE", "PRESTAGE"}
_READS = {"EXPORT", "MANIFEST", "STAGING", "DIGEST", "HAVE"}
_PRECOPY_MISMATCH = "does not fit the pre-copy"     # the fsm's text for a DELTA B cannot apply


class MoveStepRefused(Exception):
    """The group's fsm refused the step (nothing changed): the text says why."""


class MoveStepUnavailable(Exception):
    """The group's leader did not complete the step before the deadline."""


class DigestMismatch(MoveStepRefused):
    def __init__(self, source: bytes, staged: bytes):
        super().__init__("digest mismatch: source %s, staged %s" % (source.hex(), staged.hex()))
        self.source, self.staged = source, staged


# -- the node side: one step on a group this node hosts ----------------------------------------

class SlotMoveRpcs:
    def __init__(self, backends: dict, slot_map, grpc_of_node: dict):
        self.backends = backends                  # {group id: RaftBackend}
        self.slot_map = slot_map
        self.grpc_of_node = grpc_of_node          # {node id: gRPC address}
        self.failpoint = os.environ.get("XRAFT_FAILPOINT", "")
        self._done: dict = {}                     # op -> successful steps led here (failpoints)
        self._pieces: dict = {}                   # the live EXPORT's record sent in pieces (export_chunk)

    async def step(self, req: pb.SlotMoveStepRequest) -> pb.SlotMoveStepResponse:
        op = req.op.upper()
        if op not in _WRITES and op not in _READS:
            raise EngineError("ERR unknown slot move step %r" % req.op[:32])
        b = self.backends.get(req.group_id)
        if b is None:
            spec = self.slot_map.groups.get(req.group_id)
            if spec is None:
                raise EngineError("ERR no group %d in the slot map" % req.group_id)
            leader = self.grpc_of_node.get(spec.preferred_leader)
            if not leader:
                return pb.SlotMoveStepResponse(unavailable="no address for group %d's nodes" % req.group_id)
            return pb.SlotMoveStepResponse(leader_grpc=leader)
        m = MoveId(req.first, req.last, req.started_epoch)
        try:
            out = await (self._write(b, op, m, req) if op in _WRITES else self._read(b, op, m, req))
        except NotLeader as exc:
            leader = getattr(exc, "grpc_address", None)
            if not leader:                        # an election is on: nobody to follow yet
                return pb.SlotMoveStepResponse(unavailable="group %d has no known leader" % req.group_id)
            return pb.SlotMoveStepResponse(leader_grpc=leader)
        except MoveRefused as exc:
            return pb.SlotMoveStepResponse(refused=exc.message)
        except BackendError as exc:               # Unavailable, UnknownOutcome: retry
            return pb.SlotMoveStepResponse(unavailable=str(exc))
        if not out.refused:
            self._count(op)
        return out

    async def _write(self, b, op: str, m: MoveId, req) -> pb.SlotMoveStepResponse:
        args = ()
        if op == "STAGE":
            args = (req.cursor, req.next_cursor, b"%d" % req.source_now_ms, req.chunk, req.sessions)
        elif op == "PRESTAGE":
            args = (req.cursor, req.next_cursor, req.chunk)
        elif op == "ACTIVATE":
            args = (req.digest,)
        if not (m.first <= m.last < 16384 and m.started_epoch > 0):
            return pb.SlotMoveStepResponse(refused="ERR xraft: bad move %s" % m)
        [result] = await b.submit([Request(0, 0, Kind.SLOT_MOVE, (move_argv(op, m, *args),))])
        if isinstance(result, EngineError):
            return pb.SlotMoveStepResponse(refused=result.message)
        return pb.SlotMoveStepResponse(count=result if isinstance(result, int) else 0)

    async def _read(self, b, op: str, m: MoveId, req) -> pb.SlotMoveStepResponse:
        if op == "EXPORT":
            try:
                have = decode_have(req.have) if req.have else None
            except ValueError as exc:
                return pb.SlotMoveStepResponse(refused="ERR xraft: bad pre-copy list: %s" % exc)

            def run(sm):
                return export_chunk(sm, m, req.cursor, req.max_bytes or DEFAULT_CHUNK_BYTES, live=req.live,
                                    have=have, pieces=self._pieces) + (sm.last_now_ms,)
            # The records (dumping a big stream: tens of ms) in the prepare thread, so the loop
            # serves the other groups: the sealed copy's keys change under no apply; the
            # pre-copy's do (A serves them), so A's group is held while they are dumped. Not
            # the session table's (any write changes it; it is small).
            records = req.cursor not in (END, KEYS_DONE)
            chunk, nxt, done, sessions, now = await b.read_state(run, off_loop=records and not req.live,
                                                                 held=records and req.live)
            return pb.SlotMoveStepResponse(chunk=chunk, next_cursor=nxt, done=done, sessions=sessions,
                                           source_now_ms=now)
        if op in ("MANIFEST", "DIGEST"):
            fn = manifest if op == "MANIFEST" else live_digest
            # MANIFEST dumps every sealed key (off the loop, as the sealed EXPORT); DIGEST the
            # target's live keys, which its writes may change: on the loop.
            return pb.SlotMoveStepResponse(digest=await b.read_state(lambda sm: fn(sm, m),
                                                                     off_loop=op == "MANIFEST"))
        if op == "HAVE":
            # B's pre-copy base (parsing each stream record for its last node): no apply changes
            # it once the pre-copy is over, and HAVE is asked after it.
            return pb.SlotMoveStepResponse(have=await b.read_state(lambda sm: staged_have(sm, m), off_loop=True))
        phase, cursor, n, digest, pre_cursor, pre_count = await b.read_state(
            lambda sm: staging_status(sm, m) + precopy_status(sm, m))
        return pb.SlotMoveStepResponse(phase=phase.name if phase is not None else "", cursor=cursor, count=n,
                                       digest=digest, pre_cursor=pre_cursor, pre_count=pre_count)

    def _count(self, op: str) -> None:
        n = self._done[op] = self._done.get(op, 0) + 1
        if self.failpoint and self.failpoint == "after_%s_%d" % (op.lower(), n):
            log.warning("failpoint %s: killing this node", self.failpoint)
            os.kill(os.getpid(), signal.SIGKILL)


# -- the caller side ----------------------------------------------------------------------------

_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


def _default_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)


def tls_channels(tls) -> Callable[[str], grpc.aio.Channel]:
    """MoveSteps' `channel` for a node whose gRPC port serves TLS (runtime TlsConfig; None:
    insecure): the same credentials and server name its peer links use."""
    if tls is None:
        return _default_channel
    opts = list(_CHANNEL_OPTIONS)
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return lambda address: grpc.aio.secure_channel(address, tls.channel_credentials(), options=opts)


class MoveSteps:
    """The reconciler's calls. `voters(group) -> [gRPC address]`: where to look for a group's
    leader (the slot map's voters, preferred leader first); `channel(address)`: a gRPC channel
    to a node (the node's own TLS settings; insecure by default)."""

    def __init__(self, voters: Callable[[int], list], *, token: Optional[str] = None,
                 channel: Callable[[str], grpc.aio.Channel] = _default_channel,
                 step_timeout_s: float = STEP_TIMEOUT_S):
        self._voters = voters
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._channel_of = channel
        self._channels: dict = {}
        self._leader: dict = {}                    # group -> the address that answered last
        self.step_timeout_s = step_timeout_s

    @classmethod
    def from_slot_map(cls, slot_map, **kw) -> "MoveSteps":
        def voters(gid: int) -> list:
            spec = slot_map.groups[gid]
            order = [spec.preferred_leader] + [v for v in spec.voters if v != spec.preferred_leader]
            return [slot_map.nodes[n].grpc for n in order]
        return cls(voters, **kw)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    def _stub(self, address: str):
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = self._channel_of(address)
        return pb_grpc.XRaftStub(ch)

    async def _call(self, op: str, group: int, m: MoveId, **fields) -> pb.SlotMoveStepResponse:
        req = pb.SlotMoveStepRequest(op=op, group_id=group, first=m.first, last=m.last,
                                     started_epoch=m.started_epoch, **fields)
        return await self.call_leader("SlotMoveStep", group, req, op)

    async def call_leader(self, rpc: str, group: int, req, what: str):
        """`rpc` (a method whose response has refused / leader_grpc / unavailable, as
        SlotMoveStep's) on `group`'s leader, following redirects and retrying until the step
        deadline (the class doc); `what` names the call in errors."""
        op = what
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.step_timeout_s
        candidates = list(self._voters(group))
        target = self._leader.get(group) or candidates[0]
        attempt, why = 0, ""
        while True:
            try:
                resp = await getattr(self._stub(target), rpc)(
                    req, metadata=self._metadata, timeout=min(RPC_TIMEOUT_S, max(0.1, deadline - loop.time())))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.CANCELLED):
                    raise MoveStepRefused("%s at group %d: %s %s" % (op, group, exc.code().name, exc.details()))
                resp, why = None, "%s: %s" % (target, exc.code().name)
                if self._leader.get(group) == target and target in candidates:
                    # A hung node (paused, a stuck disk) times out every attempt for the whole
                    # step: the next call starts from the next replica, not from it again.
                    self._leader[group] = candidates[(candidates.index(target) + 1) % len(candidates)]
            if resp is not None:
                if resp.refused:
                    raise MoveStepRefused(resp.refused)
                if not resp.leader_grpc and not resp.unavailable:
                    self._leader[group] = target
                    return resp
                why = resp.unavailable or "not the leader (%s)" % target
            attempt += 1
            if loop.time() >= deadline:
                raise MoveStepUnavailable("%s at group %d: no leader answered within %.0fs (%s)"
                                          % (op, group, self.step_timeout_s, why))
            if resp is not None and resp.leader_grpc and resp.leader_grpc != target:
                target = resp.leader_grpc
                if attempt <= len(candidates):
                    continue                                  # follow a fresh redirect at once
            else:
                target = candidates[attempt % len(candidates)]
            # Stale hints bouncing between nodes, an election, a node down: back off a little.
            await asyncio.sleep(min(RETRY_S[1], RETRY_S[0] * (2 ** min(attempt, 5))))

    # -- the steps ------------------------------------------------------------------------------
    async def seal(self, source_group: int, first: int, last: int, started_epoch: int) -> None:
        await self._call("SEAL", source_group, MoveId(first, last, started_epoch))

    async def staging(self, target_group: int, first: int, last: int, started_epoch: int):
        """(phase name or "", cursor, keys staged, digest) of the move's staging at B."""
        r = await self._call("STAGING", target_group, MoveId(first, last, started_epoch))
        return r.phase, r.cursor, r.count, r.digest

    async def copy(self, source_group: int, target_group: int, first: int, last: int, started_epoch: int,
                   cursor: Optional[bytes] = None, progress=None,
                   max_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple:
        """Export at A -> STAGE at B until the copy is complete; (END, keys staged). Resumes
        from B's replicated cursor (`cursor` is only the caller's idea of it; B's wins)."""
        m = MoveId(first, last, started_epoch)
        max_bytes = max(1, min(max_bytes, MAX_CHUNK_BYTES))
        phase, at, staged, _ = await self.staging(target_group, first, last, started_epoch)
        if phase == "ACTIVE":
            return END, staged
        cursor = at or encode_cursor(first, 0)
        # B's pre-copied streams: A sends them as DELTA records. If B cannot apply one (A's
        # stream changed before its last pre-copied node), the rest goes in full.
        have = (await self._call("HAVE", target_group, m)).have if cursor != END else b""
        while cursor != END:
            exp = await self._call("EXPORT", source_group, m, cursor=cursor, max_bytes=max_bytes, have=have)
            if len(exp.next_cursor) != len(END) or exp.next_cursor <= cursor or len(exp.chunk) > max_bytes:
                raise MoveStepRefused("group %d answered EXPORT with a bad cursor %r" % (source_group,
                                                                                         exp.next_cursor[:16]))
            try:
                r = await self._call("STAGE", target_group, m, cursor=cursor, next_cursor=exp.next_cursor,
                                     source_now_ms=exp.source_now_ms, chunk=exp.chunk, sessions=exp.sessions)
            except MoveStepRefused as exc:
                if have and _PRECOPY_MISMATCH in str(exc):
                    log.info("move %s: %s; copying the rest in full", m, exc)
                    have = b""
                    continue
                if "at cursor" not in str(exc):
                    raise
                _, cursor, staged, _ = await self.staging(target_group, first, last, started_epoch)
                continue                                   # another copier moved B on: follow B
            cursor, staged = exp.next_cursor, r.count
            if progress is not None:
                progress(cursor, staged)
        return END, staged

    async def precopy(self, source_group: int, target_group: int, first: int, last: int, started_epoch: int,
                      progress=None, max_bytes: int = PRECOPY_CHUNK_BYTES) -> int:
        """Export at A while it still serves -> PRESTAGE at B, until every key was offered
        once; the keys B pre-copied. Resumes from B's pre-copy cursor; does nothing once B's
        pre-copy is complete or its sealed copy began. Best effort: the sealed copy (copy)
        sends every key again, big streams as deltas against what this pass left at B."""
        m = MoveId(first, last, started_epoch)
        max_bytes = max(1, min(max_bytes, MAX_CHUNK_BYTES))
        r = await self._call("STAGING", target_group, m)
        start = encode_cursor(first, 0)
        if r.phase not in ("", "STAGING") or (r.cursor and r.cursor != start):
            return r.pre_count
        cursor, count = r.pre_cursor or start, r.pre_count
        while cursor != END:
            exp = await self._call("EXPORT", source_group, m, cursor=cursor, max_bytes=max_bytes, live=True)
            if len(exp.next_cursor) != len(END) or exp.next_cursor <= cursor or len(exp.chunk) > max_bytes:
                raise MoveStepRefused("group %d answered EXPORT with a bad cursor %r" % (source_group,
                                                                                         exp.next_cursor[:16]))
            count = (await self._call("PRESTAGE", target_group, m, cursor=cursor, next_cursor=exp.next_cursor,
                                      chunk=exp.chunk)).count
            cursor = exp.next_cursor
            if progress is not None:
                progress(cursor, count)
        return count

    async def verify(self, source_group: int, target_group: int, first: int, last: int,
                     started_epoch: int) -> bytes:
        """A's manifest, once B's staging is complete and has the same digest."""
        m = MoveId(first, last, started_epoch)
        source = (await self._call("MANIFEST", source_group, m)).digest
        phase, cursor, _, staged = await self.staging(target_group, first, last, started_epoch)
        if phase == "ACTIVE":
            return source
        if cursor != END:
            raise MoveStepRefused("staging of move %s at group %d is not complete (phase %s)"
                                  % (m, target_group, phase or "none"))
        if staged != source:
            raise DigestMismatch(source, staged)
        return source

    async def activate(self, target_group: int, first: int, last: int, started_epoch: int, digest: bytes) -> None:
        await self._call("ACTIVATE", target_group, MoveId(first, last, started_epoch), digest=digest)

    async def release(self, source_group: int, first: int, last: int, started_epoch: int) -> None:
        """RELEASE, then PURGE until A holds no key of the slots."""
        m = MoveId(first, last, started_epoch)
        left = (await self._call("RELEASE", source_group, m)).count
        while left:
            left = (await self._call("PURGE", source_group, m)).count

    async def live_digest(self, group: int, first: int, last: int, started_epoch: int) -> bytes:
        """The digest of what `group` serves in the slots (it must own them all): after
        ACTIVATE, B's equals A's manifest."""
        return (await self._call("DIGEST", group, MoveId(first, last, started_epoch))).digest

    async def abort(self, source_group: int, target_group: int, first: int, last: int,
                    started_epoch: int) -> None:
        m = MoveId(first, last, started_epoch)
        await self._call("UNSEAL", source_group, m)
        await self._call("DROP_STAGING", target_group, m)
