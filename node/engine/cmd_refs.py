"""XDELEX and XACKDEL (Redis 8.2): delete stream entries, or acknowledge and
delete them, under a KEEPREF | DELREF | ACKED policy (refs.py).

Pages followed: redis.io commands/xdelex and commands/xackdel; replies and
errors from redis 8.2's tests ("XDELEX IDS parameter validation", "XACKDEL
with KEEPREF", "XACKDEL should return empty array when key doesn't exist or
group doesn't exist", ...).

    XDELEX key [KEEPREF | DELREF | ACKED] IDS numids id [id ...]
        per ID: 1 deleted, -1 no such entry, 2 kept because a group still
        needs it (ACKED); -1 for every ID when the key does not exist.
    XACKDEL key group [KEEPREF | DELREF | ACKED] IDS numids id [id ...]
        per ID: 1 acknowledged and/or deleted, -1 neither pending in the group
        nor in the stream, 2 acknowledged but kept (ACKED); -1 for every ID
        when the key or the group does not exist. Then the stream's ACKED
        retention, if set, runs (refs.apply_retention), as after XACK.
"""
from . import groups as g
from .commands import WRITE, command
from .errors import CommandError, syntax_error
from .refs import KEEPREF, apply_retention, delete_with_policy, parse_policy
from .stream_args import lookup_stream
from .streamid import parse_strict_ids, string2ll

ERR_NUMIDS = "ERR Number of IDs must be a positive integer"
ERR_NUMIDS_MISMATCH = "ERR The `numids` parameter must match the number of arguments"


def parse_policy_and_ids(args) -> tuple:
    """(policy, [StreamID]) from `[KEEPREF|DELREF|ACKED] IDS numids id ...`;
    the policy at most once, the IDS block exactly once."""
    policy = ids = None
    n = len(args)
    i = 0
    while i < n:
        low = args[i].lower()
        named = parse_policy(low)
        if named is not None and policy is None:
            policy = named
            i += 1
        elif low == b"ids" and ids is None and i + 1 < n:
            numids = string2ll(args[i + 1])
            if numids is None or numids <= 0:
                raise CommandError(ERR_NUMIDS)
            if numids > n - i - 2:
                raise CommandError(ERR_NUMIDS_MISMATCH)
            ids = parse_strict_ids(args[i + 2:i + 2 + numids])
            i += 2 + numids
        else:
            raise syntax_error()
    if ids is None:
        raise syntax_error()
    return policy or KEEPREF, ids


@command("xdelex", -5, (WRITE,), 1, 1, 1)
def xdelex(db, argv, now_ms):
    """XDELEX key [KEEPREF|DELREF|ACKED] IDS numids id [id ...]"""
    policy, ids = parse_policy_and_ids(argv[2:])
    stream = lookup_stream(db, argv[1])
    if stream is None:
        return [-1] * len(ids)
    return [delete_with_policy(stream, sid, policy) for sid in ids]


@command("xackdel", -6, (WRITE,), 1, 1, 1)
def xackdel(db, argv, now_ms):
    """XACKDEL key group [KEEPREF|DELREF|ACKED] IDS numids id [id ...]"""
    policy, ids = parse_policy_and_ids(argv[3:])
    stream = lookup_stream(db, argv[1])
    group = None if stream is None else g.lookup_group(stream, argv[2])
    if group is None:
        return [-1] * len(ids)
    out = [delete_with_policy(stream, sid, policy, g.drop_pending(group, sid)) for sid in ids]
    apply_retention(stream)
    return out
