"""FUNCTION and DEBUG: what redis tools send on connect or between tests.

FUNCTION. xraft has no functions (no scripting at all): FLUSH succeeds, LIST
is empty, STATS shows no libraries, DUMP is redis 7.0's payload of an empty
library set and RESTORE of that payload succeeds; DELETE and KILL answer
redis's errors for a server without libraries or running scripts. LOAD and
RESTORE of anything else are refused (functions would have to be replicated
code run at apply: not supported). Argument checks are redis 7.0.15's
(functions.c).

DEBUG. Served:
    SLEEP <seconds>              sleeps this connection only (the node keeps
                                 serving every other client); redis's strtod
                                 parsing, so a non-number sleeps 0
    SET-ACTIVE-EXPIRE <0|1>      accepted: xraft keeps no key expiry at all
    HELP                         the list below
Every other subcommand redis 7.0 has (RELOAD, OBJECT, DIGEST, POPULATE,
MALLCTL, HTSTATS ...) is refused with "ERR xraft: DEBUG <sub> is not
supported"; names redis does not know (JMAP ...) get redis's own error
"unknown subcommand or wrong number of arguments for 'jmap'. Try DEBUG HELP.",
as does a served subcommand with the wrong number of arguments.
"""
import asyncio
import re

from ..engine.errors import CommandError, EngineError, wrong_arity
from ..engine.replies import OK, Status

ERR_NO_FUNCTIONS = "ERR xraft: functions are not supported (no scripting)"
ERR_NOTBUSY = "NOTBUSY No scripts in execution right now."
# FUNCTION DUMP with no libraries on redis 7.0: RDB version 10, then the CRC64.
EMPTY_FUNCTIONS_DUMP = b"\n\x00]\x9b\\@\x0f\x7f\xa2\xda"

FUNCTION_ARITY = {b"delete": 3, b"dump": 2, b"flush": -2, b"help": 2, b"kill": 2, b"list": -2,
                  b"load": -3, b"restore": -3, b"stats": 2}

FUNCTION_HELP = [
    b'FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:',
    b'LOAD [REPLACE] <FUNCTION CODE>',
    b'    Create a new library with the given library name and code.',
    b'DELETE <LIBRARY NAME>',
    b'    Delete the given library.',
    b'LIST [LIBRARYNAME PATTERN] [WITHCODE]',
    b'    Return general information on all the libraries:',
    b'    * Library name',
    b'    * The engine used to run the Library',
    b'    * Library description',
    b'    * Functions list',
    b'    * Library code (if WITHCODE is given)',
    b'    It also possible to get only function that matches a pattern using LIBRARYNAME argument.',
    b'STATS',
    b'    Return information about the current function running:',
    b'    * Function name',
    b'    * Command used to run the function',
    b'    * Duration in MS that the function is running',
    b'    If no function is running, return nil',
    b'    In addition, returns a list of available engines.',
    b'KILL',
    b'    Kill the current running function.',
    b'FLUSH [ASYNC|SYNC]',
    b'    Delete all the libraries.',
    b'    When called without the optional mode argument, the behavior is determined by the',
    b'    lazyfree-lazy-user-flush configuration directive. Valid modes are:',
    b'    * ASYNC: Asynchronously flush the libraries.',
    b'    * SYNC: Synchronously flush the libraries.',
    b'DUMP',
    b'    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command',
    b'RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]',
    b'    Restore the libraries represented by the given payload, it is possible to give a restore policy to',
    b'    control how to handle existing libraries (default APPEND):',
    b'    * FLUSH: delete all existing libraries.',
    b'    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.',
    b'    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old',
    b'      libraries with the new libraries (notice that even on this option there is a chance of failure',
    b'      in case of functions name collision with another library).',
    b'HELP',
    b'    Prints this help.',
]


def _subcommand_syntax(cmd: str, sub: bytes) -> CommandError:
    return CommandError("ERR unknown subcommand or wrong number of arguments for '%s'. Try %s HELP."
                        % (sub[:128].decode("utf-8", "replace"), cmd))


def function_command(argv):
    sub = bytes(argv[1]).lower()
    arity = FUNCTION_ARITY.get(sub)
    if arity is None:
        return CommandError("ERR unknown subcommand '%s'. Try FUNCTION HELP."
                            % bytes(argv[1])[:128].decode("utf-8", "replace"))
    n = len(argv)
    if (arity > 0 and n != arity) or (arity < 0 and n < -arity):
        return wrong_arity("function|" + sub.decode())
    args = [bytes(a) for a in argv[2:]]
    if sub == b"flush":
        if len(args) > 1:
            return _subcommand_syntax("FUNCTION", bytes(argv[1]))
        if args and args[0].lower() not in (b"sync", b"async"):
            return CommandError("ERR FUNCTION FLUSH only supports SYNC|ASYNC option")
        return OK
    if sub == b"list":
        with_code = have_name = False
        i = 0
        while i < len(args):
            a = args[i].lower()
            if not with_code and a == b"withcode":
                with_code = True
            elif not have_name and a == b"libraryname":
                if i >= len(args) - 1:
                    return CommandError("ERR library name argument was not given")
                have_name = True
                i += 1
            else:
                return CommandError("ERR Unknown argument %s" % args[i].decode("utf-8", "replace"))
            i += 1
        return []
    if sub == b"stats":
        return {b"running_script": None,
                b"engines": {b"LUA": {b"libraries_count": 0, b"functions_count": 0}}}
    if sub == b"dump":
        return EMPTY_FUNCTIONS_DUMP
    if sub == b"restore":
        if len(args) > 2:
            return _subcommand_syntax("FUNCTION", bytes(argv[1]))
        if len(args) == 2 and args[1].lower() not in (b"flush", b"append", b"replace"):
            return CommandError("ERR Wrong restore policy given, value should be either FLUSH, "
                                "APPEND or REPLACE.")
        return OK if args[0] == EMPTY_FUNCTIONS_DUMP else CommandError(ERR_NO_FUNCTIONS)
    if sub == b"delete":
        return CommandError("ERR Library not found")
    if sub == b"kill":
        return EngineError(ERR_NOTBUSY)
    if sub == b"help":
        return [Status(line.decode()) for line in FUNCTION_HELP]
    return CommandError(ERR_NO_FUNCTIONS)                 # LOAD


# -- DEBUG -------------------------------------------------------------------------------

REDIS_DEBUG_SUBCOMMANDS = frozenset((
    b"aof-flush-sleep", b"assert", b"change-repl-id", b"config-rewrite-force-all",
    b"crash-and-recover", b"digest", b"digest-value", b"error", b"leak", b"log", b"htstats",
    b"htstats-key", b"loadaof", b"replicate", b"mallctl", b"mallctl-str", b"object",
    b"drop-cluster-packet-filter", b"oom", b"panic", b"populate", b"protocol", b"reload",
    b"restart", b"sdslen", b"segfault", b"set-active-expire", b"quicklist-packed-threshold",
    b"set-skip-checksum-validation", b"sleep", b"stringmatch-test", b"structsize", b"listpack",
    b"quicklist", b"client-eviction", b"pause-cron", b"replybuffer", b"clusterlink", b"help"))
DEBUG_SERVED = {b"sleep": 3, b"set-active-expire": 3, b"help": 2}
DEBUG_HELP = [
    b"DEBUG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    b"SET-ACTIVE-EXPIRE <0|1>",
    b"    Accepted; xraft keeps no key expiry.",
    b"SLEEP <seconds>",
    b"    Delay this connection's reply by <seconds> (decimals allowed); other clients are served.",
    b"HELP",
    b"    Prints this help.",
]
_STRTOD = re.compile(rb"\s*[+-]?(\d+\.?\d*(e[+-]?\d+)?|\.\d+(e[+-]?\d+)?|inf(inity)?|nan)", re.I)
MAX_DEBUG_SLEEP_S = 365 * 86400.0


def strtod(arg: bytes) -> float:
    """C strtod of the argument's longest numeric prefix; 0.0 when there is none."""
    m = _STRTOD.match(arg)
    if not m:
        return 0.0
    try:
        return float(m.group(0))
    except ValueError:
        return 0.0


async def debug_command(argv):
    sub = bytes(argv[1]).lower()
    n = len(argv)
    if DEBUG_SERVED.get(sub) == n:
        if sub == b"sleep":
            seconds = strtod(bytes(argv[2]))
            if seconds == seconds and seconds > 0:          # NaN or <= 0: no sleep
                await asyncio.sleep(min(seconds, MAX_DEBUG_SLEEP_S))
            return OK
        if sub == b"set-active-expire":
            return OK
        return [Status(line.decode()) for line in DEBUG_HELP]
    if sub in REDIS_DEBUG_SUBCOMMANDS and sub not in DEBUG_SERVED:
        return CommandError("ERR xraft: DEBUG %s is not supported (served: SLEEP, SET-ACTIVE-EXPIRE, HELP)"
                            % sub.decode().upper())
    return _subcommand_syntax("DEBUG", bytes(argv[1]))
