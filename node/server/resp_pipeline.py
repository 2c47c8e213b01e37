"""Pipelined writes on a RESP connection become one submission (issue 14).

A client that pipelines (redis-benchmark -P 16, redis-py pipelines without
MULTI) sends many commands in one read. The command loop (resp_server.Client)
runs commands one after the other; when the command at its head is a *plain
write* (below), `run_writes` also takes the plain writes right behind it that
are already complete in the parser's buffer and go to the same Raft group, and
submits them together: one backend.submit, so one record, riding the same
group commit as every other submit (gRPC batches included). Their replies come
back in order, and the loop writes what it produced in one write once the
parser has no complete command left.

Plain write: outside MULTI, authenticated, no ASKING pending, not a server
command (server.c's connection commands run in resp_server), a known write
with the right arity, not a blocking form, keys in one slot this node serves
(no -MOVED/-CROSSSLOT), and resolve_command accepts it. Anything else ends
the batch and runs through the ordinary path after it: reads see the batch's
writes; a blocking command, MULTI, EXEC, WATCH, a command error or a redirect
behaves exactly as it would without batching, because those are decided
command by command there. Whether a command is plain depends only on the
connection's state (which plain writes do not change) and on the command
itself, so deciding it before the earlier writes of the batch have run gives
the same answer as deciding it after.

Per-command semantics kept: each request of the record has its own result
(an apply-time error such as WRONGTYPE is that command's reply only); an error
of the whole submission (NOTLEADER, UNKNOWN outcome, shutting down) is the
reply of every command in it, as each would have had it alone. A batch the
backend refuses as too large for one record (EntryTooLarge: nothing was
proposed) is submitted again command by command.

XADD runs: consecutive plain writes `XADD key [NOMKSTREAM] * f v [f v ...]`
to the same key with the same NOMKSTREAM (no trimming, no IDMP, no explicit
ID) become one XADD_BATCH request (fsm/xadd_batch.py) instead of N COMMAND
requests: apply(XAddBatch) is by contract the MULTI of those N XADDs, results
included, so its per-entry results are the N replies, in order (one argv less
to size, encode, decode and parse per entry, and one compiled append pass).
A run that does not fit one XAddBatch goes as its N commands. Such an XADD
skips resolve_command (lookup has checked its arity and an XADD never blocks);
its own request is built (and sized) only if it runs alone.
"""
import time
from dataclasses import dataclass
from typing import Optional

from ..engine.commands import lookup
from ..engine.errors import EngineError
from ..fsm.entry import IdKind, XAddBatch
from ..fsm.errors import EntryTooLarge
from ..fsm.resolve import resolve_command, resolve_xadd_batch
from ..invariant import invariant
from .backend import BackendError
from .cluster_cmds import command_keys
from .info import SERVER_COMMANDS
from .resp import RespProtocolError, encode_error
from .routing import CrossSlot, common_slot, error_reply_text, redirect_slot

MAX_BATCH_COMMANDS = 1024        # commands in one submission (entry.MAX_REQUESTS is far above)
MAX_BATCH_BYTES = 1 << 20        # request bytes in one submission (a record may hold 8 MB by default)
_SERVER_COMMANDS = frozenset(name.encode() for name in SERVER_COMMANDS)
_REQUEST_HEAD = 32               # a request's header and argc in a record, rounded up


@dataclass(slots=True)
class PlainWrite:
    name: bytes                   # the command's name, lower case (CLIENT LIST cmd=, request stats)
    request: object               # fsm.entry.Request, resolved; None: a run-able XADD, resolved if it runs alone
    group: int                    # the Raft group the slot belongs to (Backend.group_of_slot)
    size: int                     # about its bytes in a record
    xadd_run: Optional[tuple] = None  # (key, no_mkstream, fields) of a run-able XADD (module doc), else None
    argv: object = None           # a run-able XADD's argv (its request when it runs alone)


def _xadd_run_form(argv) -> Optional[tuple]:
    """(key, no_mkstream, fields) if `argv` (an XADD redis accepts the arity of) is
    `XADD key [NOMKSTREAM] * f v [f v ...]`, else None. Anything else (trim options,
    IDMP, an explicit or ms-* ID, a repeated NOMKSTREAM, an odd field list) runs as itself."""
    start = 3 if bytes(argv[2]).lower() == b"nomkstream" else 2
    if len(argv) < start + 3 or bytes(argv[start]) != b"*" or (len(argv) - start - 1) % 2:
        return None
    return bytes(argv[1]), start == 3, [bytes(a) for a in argv[start + 1:]]


def plain_write(client, argv) -> Optional[PlainWrite]:
    """`argv` as a PlainWrite if it is one (module doc), else None: the ordinary path runs it."""
    if client.multi is not None or not client.authenticated or client.asking:
        return None
    name = bytes(argv[0]).lower()
    if name in _SERVER_COMMANDS:
        return None
    try:
        spec = lookup(argv)
        if not spec.is_write:
            return None
        slot = common_slot(command_keys(spec, argv))
        backend = client.server.backend
        if slot is None or redirect_slot(backend, slot) is not None:
            return None
        # About its bytes in a record (entry.request_size's layout: 4 per length): only the
        # batch's bound needs it, and a batch that does not fit anyway falls back (run_writes).
        size = _REQUEST_HEAD + 4 * len(argv) + sum(map(len, argv))
        group = backend.group_of_slot(slot)
        run = _xadd_run_form(argv) if name == b"xadd" else None
        if run is not None:
            # lookup has checked its arity, and an XADD never blocks: of resolve_command's
            # checks only the record size is left, made when its request is built.
            return PlainWrite(name, None, group, size, run, argv)
        resolved = resolve_command(0, 0, argv)
        if resolved.plan is not None:     # a blocking form: parks (resp_server's path)
            return None
        return PlainWrite(name, resolved.request, group, size)
    except (EngineError, CrossSlot):
        return None                      # the ordinary path replies with the error


def take_batch(client, first: PlainWrite) -> list:
    """`first` and the plain writes to its group right behind it in the parser's buffer,
    within the batch limits. A complete command that does not join is held by the client
    (client.held) and runs next; a protocol error stays in the parser (it re-raises)."""
    batch = [first]
    size = first.size
    parser = client.parser
    while len(batch) < MAX_BATCH_COMMANDS:
        try:
            argv = parser.next_command()
        except RespProtocolError:
            break                        # the command loop meets it after these replies
        if argv is None:
            break
        write = plain_write(client, argv)
        if write is None or write.group != first.group or size + write.size > MAX_BATCH_BYTES:
            client.held = argv
            break
        batch.append(write)
        size += write.size
    return batch


async def run_writes(client, first: PlainWrite) -> list:
    """Run `first` with the plain writes behind it as one submission; their encoded replies, in order."""
    batch = take_batch(client, first)
    client.last_active = time.monotonic()
    client.last_cmd = batch[-1].name.decode("latin-1")
    backend = client.server.backend
    t0 = time.perf_counter()
    try:
        try:
            requests, spans = _with_xadd_runs(batch)
            results = _expand(await backend.submit(requests) if requests else [], spans)
        except EntryTooLarge:
            if len(batch) == 1:
                raise
            results = []                 # nothing was proposed: one submission per command
            for w in batch:
                try:
                    results.append((await backend.submit([_request_of(w)]))[0])
                except (EngineError, BackendError) as e:
                    results.append(EngineError(error_reply_text(e)))
        replies = [client.encode(r) for r in results]
    except (EngineError, BackendError) as e:
        replies = [encode_error(error_reply_text(e))] * len(batch)
    stats = client.server.request_stats
    if stats is not None:
        elapsed = time.perf_counter() - t0
        for w in batch:
            stats.observe(w.name[:32].decode("latin-1"), elapsed)
    return replies


def _request_of(write: PlainWrite):
    """The write's own request (resolving a run-able XADD now: EntryTooLarge if it is oversize)."""
    return write.request if write.request is not None else resolve_command(0, 0, write.argv).request


def _with_xadd_runs(batch) -> tuple:
    """The requests to submit for `batch`, each run of 2+ XADDs (module doc) as one
    XADD_BATCH request, and per command or run, in order, what answers it: 0 (a plain
    request, one command), n > 0 (an XADD_BATCH request of n commands) or an EngineError
    (a lone XADD refused before proposing: its reply, no request)."""
    requests, spans = [], []
    i, n = 0, len(batch)
    while i < n:
        run = batch[i].xadd_run
        j = i + 1
        if run is not None:
            while j < n and batch[j].xadd_run is not None and batch[j].xadd_run[:2] == run[:2]:
                j += 1
        if j - i >= 2:
            try:
                entries = [(IdKind.AUTO, 0, 0, w.xadd_run[2]) for w in batch[i:j]]
                requests.append(resolve_xadd_batch(0, 0, XAddBatch.build(run[0], entries, no_mkstream=run[1])))
                spans.append(j - i)
                i = j
                continue
            except EntryTooLarge:
                pass                     # the run does not fit one XAddBatch: its commands one by one
        for w in batch[i:j]:
            try:
                requests.append(_request_of(w))
                spans.append(0)
            except EngineError as e:
                spans.append(e)
        i = j
    return requests, spans


def _expand(results, spans) -> list:
    """One result per command (spans: _with_xadd_runs'): an XADD_BATCH request's per-entry
    results in order, or its error (a refusal of the whole request) as each entry's."""
    invariant(len(results) == sum(not isinstance(span, EngineError) for span in spans), "one result per request")
    out = []
    results = iter(results)
    for span in spans:
        if isinstance(span, EngineError):
            out.append(span)
            continue
        result = next(results)
        if not span:
            out.append(result)
        elif isinstance(result, EngineError):
            out.extend([result] * span)
        else:
            invariant(len(result) == span, "one result per entry of an XADD batch")
            out.extend(result)
    return out
