"""Acknowledgement-aware deletion (Redis 8.2: KEEPREF | DELREF | ACKED) and
xraft's per-stream ACKED retention.

Pages followed: redis.io commands/xdelex, commands/xackdel, commands/xadd and
commands/xtrim (the KEEPREF/DELREF/ACKED options), and redis 8.2's
tests/unit/type/stream.tcl + stream-cgroups.tcl (replies, errors, "XTRIM with
approx and ACKED", "XGROUP DESTROY correctly manage min_cgroup_last_id").

The three policies, for an entry being deleted or trimmed:
    KEEPREF  delete it; PEL references to it stay (redis 7.0's XDEL/XTRIM)
    DELREF   delete it and drop it from every group's PEL (and its owner's)
    ACKED    delete it only if no group still needs it: none has it pending
             and every group's last-delivered-id is at or past it (a group
             that has not read it yet could still deliver it)

Retention (xraft, `XCFGSET key RETENTION ACKED`): after every XACK/XACKDEL on
the stream (and every command's dead-letter moves, dead_letters.py), the entries at its head that every group acknowledged are deleted,
up to the first one some group still needs; so the stream keeps exactly what
the slowest group has not acknowledged (and what no group has read yet), and a
pending entry is never deleted. A stream without groups is never trimmed by it.
"""
from . import groups as g
from .streamid import MIN_ID

KEEPREF = "keepref"
DELREF = "delref"
ACKED = "acked"
POLICIES = {b"keepref": KEEPREF, b"delref": DELREF, b"acked": ACKED}

RETENTION_ACKED = "acked"


def parse_policy(arg: bytes):
    """KEEPREF/DELREF/ACKED (any case) as its name, else None."""
    return POLICIES.get(arg.lower())


def _groups(stream) -> list:
    return [] if stream.cgroups is None else [group for _, group in stream.cgroups.items()]


def needed_by_a_group(groups, sid) -> bool:
    """True if some group has `sid` pending or could still deliver it."""
    for group in groups:
        if sid > group.last_id or group.pel.find(sid) is not None:
            return True
    return False


def exists(stream, sid) -> bool:
    for _ in stream.iter_range(sid, sid):
        return True
    return False


def drop_refs(stream, sid) -> None:
    """DELREF: `sid` leaves every group's PEL."""
    for group in _groups(stream):
        g.drop_pending(group, sid)


def delete_with_policy(stream, sid, policy: str, acked: bool = False) -> int:
    """XDELEX's reply for one ID: 1 deleted, -1 no such entry, 2 kept (ACKED,
    still needed by a group). XACKDEL's when `acked` (the ID was pending in
    its group and no longer is): 1 also for an acknowledged ID not in the
    stream, -1 only for an ID that was neither."""
    if policy == ACKED:
        if not exists(stream, sid):
            return 1 if acked else -1
        if needed_by_a_group(_groups(stream), sid):
            return 2
        stream.delete(sid)
        return 1
    deleted = stream.delete(sid)
    if policy == DELREF:
        drop_refs(stream, sid)
    return 1 if deleted or acked else -1


def trim_with_policy(stream, strategy: str, threshold, approx: bool, limit: int, policy: str) -> int:
    """XADD/XTRIM's trim under a policy; the number of entries deleted.

    KEEPREF is Stream.trim. DELREF is Stream.trim, then the PEL references in
    the range it removed ([old first entry, new first entry)) are dropped. ACKED
    deletes, oldest first, the entries no group needs while the stream is over
    MAXLEN / below MINID, skipping the others (so not whole nodes: redis 8.2
    does the same, "XTRIM with approx and ACKED"); LIMIT (with ~) bounds the
    deletions."""
    if policy == ACKED:
        return _trim_acked(stream, strategy, threshold, limit)
    if policy != DELREF:
        return stream.trim(strategy, threshold, approx, limit)
    old_first, old_last = stream.first_id, stream.last_id
    deleted = stream.trim(strategy, threshold, approx, limit)
    if deleted:
        end = stream.first_id if stream.length else None
        for group in _groups(stream):
            doomed = [sid for sid, _ in group.pel.items(old_first)
                      if (sid < end if end is not None else sid <= old_last)]
            for sid in doomed:
                g.drop_pending(group, sid)
    return deleted


def _trim_acked(stream, strategy: str, threshold, limit: int) -> int:
    groups = _groups(stream)
    # Entries past the slowest group's last-delivered-id are needed by it: no need to look there.
    horizon = min((group.last_id for group in groups), default=stream.last_id)
    by_len = strategy == "maxlen"
    doomed = []
    for sid, _ in stream.iter_range(MIN_ID, horizon):
        if by_len:
            if stream.length - len(doomed) <= threshold:
                break
        elif sid >= threshold:
            break
        if limit and len(doomed) >= limit:
            break
        if not needed_by_a_group(groups, sid):
            doomed.append(sid)
    for sid in doomed:
        stream.delete(sid)
    return len(doomed)


def apply_retention(stream) -> int:
    """The ACKED retention after an acknowledgement: delete the head entries
    no group needs, up to the first one some group needs. Entries deleted."""
    if stream.retention != RETENTION_ACKED:
        return 0
    groups = _groups(stream)
    if not groups:
        return 0
    doomed = []
    for sid, _ in stream.iter_range(MIN_ID, min(group.last_id for group in groups)):
        if needed_by_a_group(groups, sid):
            break
        doomed.append(sid)
    for sid in doomed:
        stream.delete(sid)
    return len(doomed)
