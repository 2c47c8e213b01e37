"""Which arguments of a command are keys (redis's getKeysFromCommand).

Used by the server (cluster redirects, COMMAND GETKEYS) and by the fsm (the
keys a write modified, for WATCH: fsm/watch.py), so it lives in the engine.
"""
from .errors import EngineError
from .stream_args import parse_xread_args
from .streamid import string2ll

MOVABLE = frozenset(("xread", "xreadgroup", "lmpop", "blmpop"))


def command_keys(spec, argv) -> list:
    """The key arguments of an engine command: fixed positions from the spec,
    or parsed for the movable-keys commands. Arguments that do not parse give
    no keys: the command fails by itself."""
    name = spec.name
    if name == "xraft.groupcfg":
        return _groupcfg_keys(argv)
    if name in MOVABLE:
        try:
            if name in ("xread", "xreadgroup"):
                return list(parse_xread_args(argv, name == "xreadgroup").keys)
            at = 1 if name == "lmpop" else 2
            n = string2ll(bytes(argv[at]))
            if n is None or n <= 0 or at + 1 + n > len(argv):
                return []
            return list(argv[at + 1:at + 1 + n])
        except EngineError:
            return []
    if spec.first_key <= 0:
        return []
    last = spec.last_key if spec.last_key > 0 else len(argv) + spec.last_key
    return list(argv[spec.first_key:last + 1:spec.step or 1])


def _groupcfg_keys(argv) -> list:
    """XRAFT.GROUPCFG key group [MAXDELIVERIES n] [DEADLETTER dead-letter-key]:
    the stream, and the dead-letter key when given (routing then answers
    CROSSSLOT for one in another slot, as the command itself does)."""
    keys = [argv[1]] if len(argv) > 1 else []
    for i in range(3, len(argv) - 1, 2):
        if argv[i].lower() == b"deadletter":
            keys.append(argv[i + 1])
    return keys
