"""XADD_BATCH requests: N XADDs to one key with the same options, in one request.

The record form (entry.py, "xadd batch") carries the key and the options
once and, per entry, an ID spec and its field/value pairs: no argv per entry
to build, size, encode, decode and parse again. Its meaning is fixed:

    apply(XAddBatch)  ==  MULTI; XADD key [NOMKSTREAM] [MAXLEN|MINID [~] thr [LIMIT n]] <id> f v ..
                          (once per entry, in order); EXEC

results included: one per entry, the new ID as bytes, None (NOMKSTREAM on a
missing key) or that entry's EngineError with redis's text; and the state
afterwards, byte for byte (tests/fsm/test_xadd_batch.py checks both against
the MULTI path). The results list is what the at-most-once table stores for
a request with a client id, as it stores a MULTI's.

An entry without fields is not an XADD redis would queue in a MULTI (arity),
so it never reaches the log: the leader answers it alone, with
`error_without_fields`, exactly what the gRPC XAdd answered for it before.
"""
from ..engine.cmd_streams import ID_AUTO, ID_AUTO_SEQ, ID_EXPLICIT, xadd_many, xadd_trim_args
from ..engine.errors import CommandError, EngineError, wrong_arity
from ..invariant import invariant
from .entry import IdKind, XAddBatch

# The record's ID kinds are handed to the engine as they are: same numbers.
invariant((IdKind.AUTO, IdKind.AUTO_SEQ, IdKind.EXPLICIT) == (ID_AUTO, ID_AUTO_SEQ, ID_EXPLICIT),
          "record and engine ID kinds agree")


def apply_xadd_batch(keyspace, batch: XAddBatch, now_ms: int) -> list:
    """Run the batch against `keyspace` at the record's time: one result per entry."""
    return xadd_many(keyspace, batch.key, batch.entries, now_ms, no_mkstream=batch.no_mkstream,
                     strategy=batch.strategy, approx=batch.approx, threshold=batch.threshold,
                     limit=batch.limit, idmp_pid=batch.idmp_pid, idmp_iids=batch.idmp_iids,
                     idmp_first=batch.idmp_first)


def error_without_fields(strategy, approx: bool, threshold, limit) -> EngineError:
    """What `XADD key [NOMKSTREAM] [trim options] <id>` with no field answers.

    Without trim options the argv is too short for XADD's arity (-5), and
    redis refuses it as MULTI queues it; with them it is long enough to be
    queued, and XADD itself answers: its option errors first, then arity."""
    if strategy is not None:
        try:
            xadd_trim_args(strategy, approx, threshold, limit, 0)
        except CommandError as e:
            return e
    return wrong_arity("xadd")
