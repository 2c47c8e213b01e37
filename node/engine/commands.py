"""The command table: name -> handler, arity and flags, as redis-server 7.0 has it.

Each command family registers its handlers from its own module (`cmd_keys.py`,
`cmd_lists.py`, `cmd_streams.py`, ...) with the `@command` decorator; `execute()`
looks the name up case-insensitively, checks arity with Redis's error text and
calls the handler.

A handler is `handler(db: Keyspace, argv: list[bytes], now_ms: int) -> reply`.
`argv[0]` is the command name as sent. `now_ms` is the only time a command may
use: the leader stamps it before proposing, so replay is deterministic.
Handlers validate every argument before changing anything: an error leaves the
keyspace exactly as it was.
"""
from dataclasses import dataclass
from typing import Callable

from .errors import UnknownCommandError, wrong_arity

WRITE = "write"          # changes state: must go through the Raft log
READONLY = "readonly"    # never changes state
BLOCKING = "blocking"    # may block in the server (BLOCK option / B* commands)
INTERNAL = "internal"    # proposed by the server itself, never accepted from a client


@dataclass(frozen=True)
class CommandSpec:
    name: str            # lower case
    handler: Callable
    arity: int           # > 0: exactly; < 0: at least -arity (argv[0] counts)
    flags: frozenset
    first_key: int       # position of the first key in argv, 0 when none
    last_key: int        # -1: the last argument; -2: the one before it ...
    step: int

    @property
    def is_write(self) -> bool:
        return WRITE in self.flags


COMMANDS: dict[str, CommandSpec] = {}
# Commands the server proposes on its own behalf (a woken client's retry): the
# log applies them, but `lookup` answers "unknown command" for them unless
# asked for internal ones, so no client can send one (not even inside MULTI).
INTERNAL_COMMANDS: dict[str, CommandSpec] = {}


def command(name: str, arity: int, flags=(), first_key: int = 1, last_key: int = 1, step: int = 1):
    """Register the decorated function as the handler of `name`."""

    def register(fn):
        key = name.lower()
        table = INTERNAL_COMMANDS if INTERNAL in flags else COMMANDS
        if key in COMMANDS or key in INTERNAL_COMMANDS:
            raise ValueError(f"command {name} registered twice")
        table[key] = CommandSpec(key, fn, arity, frozenset(flags), first_key, last_key, step)
        return fn

    return register


def unknown_command(argv) -> UnknownCommandError:
    args = ""
    for a in argv[1:]:
        if len(args) >= 128:
            break
        args += "'%s' " % a[: 128 - len(args)].decode("utf-8", "replace")
    name = argv[0][:128].decode("utf-8", "replace") if argv else ""
    return UnknownCommandError(f"ERR unknown command '{name}', with args beginning with: {args}")


def unknown_subcommand(argv) -> UnknownCommandError:
    """`XGROUP FOO` and the like: 7.0's text."""
    cmd = argv[0].decode("utf-8", "replace").upper()
    sub = argv[1][:128].decode("utf-8", "replace")
    return UnknownCommandError(f"ERR unknown subcommand '{sub}'. Try {cmd} HELP.")


def lookup(argv, internal: bool = False) -> CommandSpec:
    """The spec for argv, after the arity check; raises the Redis errors.
    `internal`: INTERNAL commands are found too (the fsm applying the log)."""
    _load_families()
    if not argv:
        raise unknown_command([b""])
    name = argv[0].decode("latin-1").lower()
    spec = COMMANDS.get(name)
    if spec is None and internal:
        spec = INTERNAL_COMMANDS.get(name)
    if spec is None:
        raise unknown_command(argv)
    n = len(argv)
    if (spec.arity > 0 and n != spec.arity) or (spec.arity < 0 and n < -spec.arity):
        raise wrong_arity(spec.name)
    return spec


def execute(db, argv, now_ms: int):
    """Run one command against `db`; returns its reply or raises EngineError."""
    spec = lookup(argv)
    return spec.handler(db, argv, now_ms)


_loaded = False


def _load_families():
    """Import every command family once so their @command decorators run."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import pkgutil

    from . import __path__ as pkg_path

    for mod in pkgutil.iter_modules(pkg_path):
        if mod.name.startswith("cmd_"):
            importlib.import_module(f"{__package__}.{mod.name}")
