"""Put every key of a command in one cluster slot, for tests written before routing.

xraft routes like a redis cluster (node/server/routing.py): keys of one command
in different slots get -CROSSSLOT. Tests that compare multi-key semantics with
a plain redis-server (BLMOVE l m, RENAME a b, MULTI over several keys) send
their commands through `one_slot`, on both sides, so they still test the
multi-key behaviour: every key gets the same hash tag prefix, and redis's
replies name the same keys as ours.
"""
from xraft.node.engine.command_keys import MOVABLE
from xraft.node.engine.commands import lookup
from xraft.node.engine.errors import EngineError
from xraft.node.engine.streamid import string2ll

TAG = "{t}"


def key_positions(argv) -> list:
    """Where the keys of argv are (bytes argv), as engine/command_keys.py finds them
    (and WATCH's, a server command whose arguments are all keys)."""
    if argv and bytes(argv[0]).lower() == b"watch":
        return list(range(1, len(argv)))
    try:
        spec = lookup(argv)
    except EngineError:
        return []
    name = spec.name
    if name in MOVABLE:
        if name in ("xread", "xreadgroup"):
            upper = [bytes(a).upper() for a in argv]
            if b"STREAMS" not in upper:
                return []
            at = upper.index(b"STREAMS") + 1
            n = (len(argv) - at) // 2
            return list(range(at, at + n))
        at = 1 if name == "lmpop" else 2
        n = string2ll(bytes(argv[at]))
        if n is None or n <= 0 or at + 1 + n > len(argv):
            return []
        return list(range(at + 1, at + 1 + n))
    if spec.first_key <= 0:
        return []
    last = spec.last_key if spec.last_key > 0 else len(argv) + spec.last_key
    return [i for i in range(spec.first_key, last + 1, spec.step or 1) if i < len(argv)]


def one_slot(argv, tag: str = TAG) -> tuple:
    """argv (str or bytes items) with TAG before every key: all in one slot."""
    raw = [a.encode() if isinstance(a, str) else bytes(a) for a in argv]
    out = list(argv)
    for i in key_positions(raw):
        a = out[i]
        out[i] = (tag + a) if isinstance(a, str) else tag.encode() + bytes(a)
    return tuple(out)
