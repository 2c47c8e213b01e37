"""Typed errors raised by the engine, carrying Redis 7.0's exact error text.

The engine never formats wire replies; it raises these. `server/` maps them to
RESP (`-<message>\\r\\n`) and gRPC statuses through one table keyed by `code`.

Every engine error is deterministic and not retriable: the same command against
the same state fails the same way on every replica, and nothing was changed.
"""


class EngineError(Exception):
    """Base of every error a command can return to its caller.

    `message` is the complete Redis error line without the leading '-',
    e.g. "WRONGTYPE Operation against a key holding the wrong kind of value".
    `code` is its first word ("ERR", "WRONGTYPE", "NOGROUP", ...).
    """

    retriable = False

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def code(self) -> str:
        return self.message.split(" ", 1)[0]

    def __eq__(self, other):  # errors compare by text: handy in differential tests
        return isinstance(other, EngineError) and other.message == self.message

    def __hash__(self):
        return hash(self.message)


class CommandError(EngineError):
    """Generic "ERR ..." errors: syntax, arity, ranges, bad IDs."""


class WrongTypeError(EngineError):
    def __init__(self):
        super().__init__("WRONGTYPE Operation against a key holding the wrong kind of value")


class NoGroupError(EngineError):
    """NOGROUP: missing key or consumer group (text varies by command)."""


class BusyGroupError(EngineError):
    def __init__(self):
        super().__init__("BUSYGROUP Consumer Group name already exists")


class UnknownCommandError(CommandError):
    """Unknown command or subcommand (text formatted as redis 7.0 does)."""


# Frequently used texts, spelled once.
SYNTAX_ERROR = "ERR syntax error"
NOT_INTEGER = "ERR value is not an integer or out of range"
INVALID_STREAM_ID = "ERR Invalid stream ID specified as stream command argument"
NO_SUCH_KEY = "ERR no such key"


def syntax_error() -> CommandError:
    return CommandError(SYNTAX_ERROR)


def not_integer() -> CommandError:
    return CommandError(NOT_INTEGER)


def wrong_arity(name: str) -> CommandError:
    return CommandError(f"ERR wrong number of arguments for '{name}' command")
