"""CONFIG SET of the engine limits, with redis-server 7.0's parsing and error texts.

Only the settings that shape replicated state are settable here, and they are
settable only through the log (entry kind CONFIG): a replica that changed its
node sizes locally would dump different bytes from the same log.

    redis name                              EngineConfig field        type
    stream-node-max-bytes                   stream_node_max_bytes     memory, 0..LLONG_MAX
    stream-node-max-entries                 stream_node_max_entries   integer, 0..LLONG_MAX
    list-max-listpack-size (alias           list_max_listpack_size    integer, INT_MIN..INT_MAX
      list-max-ziplist-size)
    list-compress-depth                     list_compress_depth       integer, 0..INT_MAX

Checked against redis 7.0.15 (config.c configSetCommand, util.c memtoull):
names are case-insensitive; an unknown or duplicate name is quoted as typed,
a bad value's setting by its registered (lower-case) name or alias; all
pairs are checked before any is set (all or nothing); an alias and its name
in one call are not "duplicate" (redis does not notice either; the last wins).
"""
from ..engine.errors import CommandError, EngineError, syntax_error, wrong_arity
from ..engine.keyspace import EngineConfig
from ..engine.streamid import string2ll
from ..invariant import invariant

_LLONG_MAX = (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


class _Setting:
    __slots__ = ("field", "memory", "lo", "hi")

    def __init__(self, field: str, memory: bool, lo: int, hi: int):
        self.field, self.memory, self.lo, self.hi = field, memory, lo, hi


_SETTINGS = {
    b"stream-node-max-bytes": _Setting("stream_node_max_bytes", True, 0, _LLONG_MAX),
    b"stream-node-max-entries": _Setting("stream_node_max_entries", False, 0, _LLONG_MAX),
    b"list-max-listpack-size": _Setting("list_max_listpack_size", False, _INT_MIN, _INT_MAX),
    b"list-max-ziplist-size": _Setting("list_max_listpack_size", False, _INT_MIN, _INT_MAX),
    b"list-compress-depth": _Setting("list_compress_depth", False, 0, _INT_MAX),
}

_MEMORY_UNITS = {b"": 1, b"b": 1, b"k": 1000, b"kb": 1024, b"m": 1000 ** 2, b"mb": 1024 ** 2,
                 b"g": 1000 ** 3, b"gb": 1024 ** 3}
_MEMTOULL_BUF = 128     # redis copies the digits into a char[128]


def memtoull(arg: bytes):
    """util.c memtoull as compiled: digits then an optional unit; no sign, no
    blanks; strtoull saturates at ULLONG_MAX and the multiplication wraps mod
    2**64. The result is then read as a signed long long. None = not a memory value."""
    if arg[:1] == b"-":
        return None
    i = 0
    while i < len(arg) and 0x30 <= arg[i] <= 0x39:
        i += 1
    mul = _MEMORY_UNITS.get(arg[i:].lower())
    if mul is None or i >= _MEMTOULL_BUF:
        return None
    value = min(int(arg[:i] or b"0"), (1 << 64) - 1)
    value = (value * mul) & ((1 << 64) - 1)
    return value - (1 << 64) if value >= 1 << 63 else value


def _failed(arg_name: bytes, why: str) -> CommandError:
    name = bytes(arg_name).decode("utf-8", "replace")
    return CommandError("ERR CONFIG SET failed (possibly related to argument '%s') - %s" % (name, why))


def parse_config_set(argv) -> list:
    """[(EngineConfig field, value)] for a CONFIG SET argv, in argument order;
    raises the EngineError redis would reply. Pure: reads no state."""
    return parse_config_set_with(argv, {})[0]


def parse_config_set_with(argv, local: dict):
    """parse_config_set when the caller also serves settings of its own:
    `local` maps a lower-case name to parse(raw bytes) -> value, raising
    ValueError(redis's reason) for a bad value. Returns (engine pairs,
    [(local name, value)]), checked together in redis's order (all or nothing)."""
    invariant(len(argv) >= 2, "parse_config_set needs CONFIG SET")
    if len(argv) < 4:
        raise wrong_arity("config|set")
    if len(argv) % 2:
        raise syntax_error()
    pairs = [(argv[i], argv[i + 1]) for i in range(2, len(argv), 2)]
    # Pass 1 (redis's lookup loop): unknown names, then duplicates, in order.
    unknown = None
    duplicate = None
    seen = set()
    for name, _ in pairs:
        setting = _SETTINGS.get(bytes(name).lower()) or local.get(bytes(name).lower())
        if setting is None:
            if unknown is None and duplicate is None:
                unknown = name
            continue
        if unknown is not None or duplicate is not None:
            continue
        key = bytes(name).lower()        # redis compares config objects: an alias is another one
        if key in seen:
            duplicate = name
        seen.add(key)
    if unknown is not None:
        raise CommandError("ERR Unknown option or number of arguments for CONFIG SET - '%s'"
                           % bytes(unknown).decode("utf-8", "replace"))
    if duplicate is not None:
        raise _failed(duplicate, "duplicate parameter")           # as typed
    # Pass 2 (performInterfaceSet): parse and range-check each value, in order.
    out = []
    own = []
    for name, raw in pairs:
        name = bytes(name).lower()          # a bad value names the setting as registered
        raw = bytes(raw)
        if name not in _SETTINGS:
            try:
                own.append((name, local[name](raw)))
            except ValueError as e:
                raise _failed(name, str(e)) from None
            continue
        setting = _SETTINGS[name]
        if setting.memory:
            # memtoull reads a C string: a NUL ends the value. Integers go through the
            # length-aware string2ll instead, so "5\0x" is not an integer there.
            value = memtoull(raw.split(b"\0", 1)[0])
            if value is None:
                raise _failed(name, "argument must be a memory value")
        else:
            value = string2ll(raw)
            if value is None:
                raise _failed(name, "argument couldn't be parsed into an integer")
        if not setting.lo <= value <= setting.hi:
            raise _failed(name, "argument must be between %d and %d inclusive" % (setting.lo, setting.hi))
        out.append((setting.field, value))
    return out, own


def is_engine_setting(name: bytes) -> bool:
    return bytes(name).lower() in _SETTINGS


def apply_config_set(config: EngineConfig, argv):
    """Set every pair or none; returns None on success, the EngineError otherwise."""
    try:
        pairs = parse_config_set(argv)
    except EngineError as e:
        return e
    for field, value in pairs:
        setattr(config, field, value)
    return None
