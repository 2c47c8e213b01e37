"""OBJECT ENCODING | REFCOUNT | IDLETIME | FREQ | HELP, as redis-server 7.0 answers them.

ENCODING names what the engine really holds, in redis 7.0's words:
    string  "int" (a canonical 64-bit integer of <= 20 bytes), "embstr"
            (<= 44 bytes) or "raw": the rules redis's tryObjectEncoding
            applies to every SET value, and the engine keeps exactly the bytes
    list    "quicklist": lists.py is a quicklist of listpack nodes, and redis
            7.0 reports every list so (the "listpack" list encoding is 7.2's)
    stream  "stream"
REFCOUNT is redis's: 2147483647 for the shared integers 0..9999, else 1.
IDLETIME is refused: xraft keeps no per-key access time (nothing a replica
could agree on without writing every read to the log). FREQ answers redis's
own error for a server without an LFU policy, which xraft never has.
"""
from .commands import READONLY, command, unknown_subcommand
from .errors import CommandError, wrong_arity
from .replies import Status
from .streamid import string2ll

_SHARED_INTEGERS = 10000
_SHARED_REFCOUNT = 2147483647
_EMBSTR_LIMIT = 44

ERR_NO_LFU = ("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note "
              "that when switching between policies at runtime LRU and LFU data will take some time "
              "to adjust.")
ERR_NO_IDLETIME = "ERR xraft keeps no per-key access time: OBJECT IDLETIME is not supported"

HELP = [
    b"OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    b"ENCODING <key>",
    b"    Return the kind of internal representation used in order to store the value",
    b"    associated with a <key>.",
    b"FREQ <key>",
    b"    Return the access frequency index of the <key>. The returned integer is",
    b"    proportional to the logarithm of the recent access frequency of the key.",
    b"IDLETIME <key>",
    b"    Return the idle time of the <key>, that is the approximated number of",
    b"    seconds elapsed since the last access to the key.",
    b"REFCOUNT <key>",
    b"    Return the number of references of the value associated with the specified",
    b"    <key>.",
    b"HELP",
    b"    Prints this help.",
]


def _int_value(value: bytes):
    return string2ll(value) if len(value) <= 20 else None


def encoding(db, key: bytes):
    """redis's encoding name for the value at key, None if there is none."""
    kind = db.type_name(key)
    if kind == "none":
        return None
    if kind == "string":
        value = db.get(key)
        if _int_value(value) is not None:
            return b"int"
        return b"embstr" if len(value) <= _EMBSTR_LIMIT else b"raw"
    return b"quicklist" if kind == "list" else kind.encode()


@command("object", -2, (READONLY,), 2, 2, 1)
def cmd_object(db, argv, now_ms):
    sub = argv[1].lower()
    if sub == b"help":
        if len(argv) != 2:
            raise wrong_arity("object|help")
        return [Status(line.decode()) for line in HELP]
    if sub not in (b"encoding", b"refcount", b"idletime", b"freq"):
        raise unknown_subcommand(argv)
    if len(argv) != 3:
        raise wrong_arity("object|" + sub.decode())
    key = argv[2]
    if not db.exists(key):
        return None
    if sub == b"encoding":
        return encoding(db, key)
    if sub == b"refcount":
        if db.type_name(key) == "string":
            n = _int_value(db.get(key))
            if n is not None and 0 <= n < _SHARED_INTEGERS:
                return _SHARED_REFCOUNT
        return 1
    if sub == b"idletime":
        raise CommandError(ERR_NO_IDLETIME)
    raise CommandError(ERR_NO_LFU)
