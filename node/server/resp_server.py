"""The RESP server: redis-cli, redis-benchmark and redis-py speak to a node here.

    RespServer           listens; owns the clients, the blocked-client registry and the limits
    Client               one connection: a RespParser, a command loop, its reply buffer

Per connection, commands run one after the other in arrival order (a
pipeline's replies come back in order because each is produced only after the
one before it); replies produced while more commands are already buffered are
written together. Consecutive plain writes to one group already in the buffer
run as one submission (resp_pipeline.py). Writes from many connections still
share records: the backend group-commits every submit made during one loop
iteration.

A command goes through redis 7.0's processCommand order (server.c):
existence and arity (unknown command / wrong number of arguments, the
connection stays), then NOAUTH while `requirepass` is set and the client has
not authenticated, then MULTI queueing (a queue-time error flags the
transaction, EXEC answers EXECABORT), then cluster routing (routing.py: -CROSSSLOT
for keys in two slots, -MOVED to the slot's leader), then execution:

    server commands   AUTH HELLO CLIENT SELECT QUIT RESET MULTI EXEC DISCARD WATCH
                      UNWATCH INFO CONFIG COMMAND CLUSTER ASKING READONLY READWRITE (here),
                      FUNCTION DEBUG (admin_cmds.py), CLIENT's subcommands (client_cmds.py)
    writes            fsm resolve_command -> backend.submit (one request; blocking
                      forms through blocking.run_blocking_write)
    reads             backend.read (XREAD BLOCK through blocking.run_blocking_read)
    MULTI/EXEC        fsm resolve_transaction -> backend.submit: one request, atomic
    WATCH             remembers (key, applied index now); EXEC sends them in its
                      request and the fsm aborts it at apply if a key changed
                      since (fsm/watch.py): correct whichever leader applies it

RESP clients carry no request ids, so requests are anonymous (client_id 0):
recording their results in the at-most-once table would only evict the
entries of clients that can retry (gRPC).

Limits: max clients (redis's "ERR max number of clients reached", then
close), the parser's (bulk length, argument count, query buffer), commands
queued in MULTI, blocked clients, and the output buffer of a client that does
not read: above the hard limit, or above the soft limit for longer than its
seconds, the client is closed as redis's client-output-buffer-limit does.
Reading from a client stops while its unprocessed input is large, so a fast
writer cannot make the parser's buffer grow without bound either.

Shutdown (RespServer.shutdown, bounded by its timeout): stop listening; fail
blocked commands (UNAVAILABLE: nothing will wake them here); let each client
finish the command it is running and write every reply produced, then close
it — commands still buffered behind it are not started, so the client can
tell them from executed ones (no reply at all). What has not closed
(a client that does not read its replies) is aborted at the deadline.
close() is the abrupt variant.
"""
import argparse
import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field

from ..engine.commands import lookup
from ..engine.errors import CommandError, EngineError, not_integer, syntax_error, wrong_arity
from ..engine.replies import OK, Status
from ..engine.stream_args import parse_xread_args
from ..engine.streamid import string2ll
from ..fsm.blocking import is_blocking_form
from ..fsm.config_set import is_engine_setting, parse_config_set_with
from ..fsm.entry import MAX_TXN_COMMANDS, MAX_WATCHED_KEYS
from ..fsm.errors import EXECABORT_TEXT
from ..fsm.resolve import queue_check, resolve_command, resolve_config_set, \
    resolve_transaction
from .admin_cmds import debug_command, function_command
from .backend import BackendError, LocalBackend
from .blocking import BlockingRegistry, WaiterClosed, run_blocking_read, run_blocking_write
from .client_memory import ClientMemory, MeteredReading
from .client_cmds import check_name, client_command, format_addr, info_line
from .cluster_cmds import Verbatim, cluster_reply, command_keys, encode_verbatim
from .info import REDIS_VERSION, SERVER_COMMANDS, command_command, config_get, info_text
from .node_config import PARSERS as NODE_SETTINGS, apply_node_settings
from .resp_pipeline import plain_write, run_writes
from .resp import (DEFAULT_MAX_MULTIBULK_LEN, DEFAULT_PROTO_MAX_BULK_LEN, DEFAULT_QUERY_BUFFER_LIMIT,
                   RespParser, RespProtocolError, encode_error, encode_reply)
from .routing import CrossSlot, common_slot, error_reply_text, follower_read_allowed, redirect, redirect_slot, \
    transaction_slot
from .wire_errors import noauth_message, not_leader_message, unavailable_message

log = logging.getLogger("xraft.resp")

ERR_MAX_CLIENTS = b"-ERR max number of clients reached\r\n"
ERR_WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
ERR_NOPASS = ("ERR AUTH <password> called without any password configured for the default user. "
              "Are you sure your configuration is correct?")
ERR_HELLO_NOAUTH = ("NOAUTH HELLO must be called with the client already authenticated, otherwise the "
                    "HELLO AUTH <user> <pass> option can be used to authenticate the client and select "
                    "the RESP protocol version at the same time")
QUEUED = Status("QUEUED")
PONG = Status("PONG")

_FLUSH_BYTES = 64 * 1024        # write accumulated pipeline replies at least this often
_NO_AUTH = frozenset((b"auth", b"hello", b"quit", b"reset"))
# Run at once even inside MULTI (redis: execCommand, discardCommand, multiCommand,
# watchCommand, quitCommand, resetCommand are never queued).
_CONTAINERS = frozenset((b"client", b"config", b"cluster", b"command", b"function", b"object",
                         b"xgroup", b"xinfo"))
_NOT_QUEUED = frozenset((b"exec", b"discard", b"multi", b"watch", b"quit", b"reset"))
# Queued by MULTI like any command in redis, but they only set a flag of the connection.
_CONNECTION_FLAGS = frozenset((b"asking", b"readonly", b"readwrite"))


@dataclass
class ServerLimits:
    max_clients: int = 10_000
    max_blocked_clients: int = 10_000
    proto_max_bulk_len: int = DEFAULT_PROTO_MAX_BULK_LEN
    query_buffer_limit: int = DEFAULT_QUERY_BUFFER_LIMIT
    max_multibulk_len: int = DEFAULT_MAX_MULTIBULK_LEN
    max_queued_commands: int = MAX_TXN_COMMANDS
    output_buffer_limit: int = 256 << 20          # hard: close at once
    output_soft_limit: int = 64 << 20             # soft: close if above for soft_seconds
    output_soft_seconds: float = 60.0
    input_pause_bytes: int = 4 << 20              # unprocessed input above this: stop reading


@dataclass
class _Multi:
    commands: list = field(default_factory=list)
    # Connection commands queued among them (ASKING READONLY READWRITE): (position
    # in the queue, name); EXEC runs them here and puts their +OK at that position.
    local: list = field(default_factory=list)
    failed: bool = False


class Client(MeteredReading, asyncio.BufferedProtocol):
    """One RESP connection. Reads through MeteredReading (client_memory.py): only
    into bytes the node's ClientMemory granted."""

    def __init__(self, server: "RespServer"):
        self.server = server
        self.id = 0
        self.transport = None
        self.parser = None
        self.addr = self.laddr = ""
        self.name = None
        self.proto = 2
        self.authenticated = server.requirepass is None
        self.multi = None               # _Multi while a MULTI is open
        # WATCHed key -> the applied log index when it was watched (fsm/watch.py).
        # Invariant: len(watched) <= MAX_WATCHED_KEYS; cleared by EXEC, DISCARD, UNWATCH, RESET.
        self.watched = {}
        self.blocked = False            # a blocking command is parked (CLIENT LIST flag b)
        self.fd = -1
        self.readonly = False           # READONLY: a follower may serve reads stale
        self.asking = False             # ASKING: the next key command may use an importing slot
        self.created = time.monotonic()
        self.last_active = self.created
        self.last_cmd = "NULL"
        self.closed = False
        self._quit = False
        self._eof = False                 # the client shut down its sending side
        self._abandon = False             # a blocked command was dropped: close
        self._data = asyncio.Event()
        self._waiting = False            # the command loop waits for input
        self._reading_paused = False
        self._soft_since = None
        self._task = None
        self.held = None                # a parsed command that did not join a write batch: next

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        server = self.server
        server.stats_connections += 1
        if len(server.clients) >= server.limits.max_clients:
            server.stats_rejected += 1
            self.closed = True
            transport.write(ERR_MAX_CLIENTS)
            transport.close()
            return
        if server.draining:               # accepted just before the listener closed
            self.closed = True
            transport.close()
            return
        lim = server.limits
        self.parser = RespParser(lim.proto_max_bulk_len, lim.query_buffer_limit, lim.max_multibulk_len,
                                 authenticated=self.authenticated)
        self.id = server.next_client_id()
        self._memory_start(server.client_memory)
        peer, sock = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        self.addr = format_addr(peer)
        sock_obj = transport.get_extra_info("socket")
        self.fd = sock_obj.fileno() if sock_obj is not None else -1
        self.laddr = format_addr(sock)
        server.clients[self.id] = self
        self._task = asyncio.get_running_loop().create_task(self._run())

    def data_received(self, data):
        if self.closed:
            return
        try:
            self.parser.feed(data)
        except RespProtocolError:
            pass                          # sticky in the parser: the command loop replies and closes
        if not self._waiting and self.parser.buffered_bytes > self.server.limits.input_pause_bytes:
            self._reading_paused = True
            self._sync_reading()
        self._data.set()

    def eof_received(self):
        # The client will send nothing more. As redis, run the complete
        # commands it already sent (their replies can still be written: the
        # socket is half-open), then close; a client blocked now is dropped.
        self._eof = True
        self.server.registry.fail_owner(self, WaiterClosed())
        self._data.set()
        return True

    def connection_lost(self, exc):
        self.closed = True
        self._memory_end()
        self._data.set()
        self.server.registry.fail_owner(self, WaiterClosed())
        self.server.client_gone(self)

    def kill(self):
        """CLIENT KILL of this client by another: close now (redis freeClient)."""
        if not self.closed and self.transport is not None:
            self.transport.abort()

    def close_after_reply(self):
        """CLIENT KILL of the caller itself: reply, then close (CLIENT_CLOSE_AFTER_REPLY)."""
        self._quit = True

    def drain(self):
        """Shutdown: finish the running command, flush, close (RespServer.shutdown)."""
        self._data.set()

    # -- the command loop ---------------------------------------------------------------
    async def _run(self):
        out = []
        size = 0
        try:
            while not self.closed:
                if self.server.draining:
                    # Shutdown: replies produced so far go out; nothing new starts.
                    self._write(out)
                    self.transport.close()    # flushes the buffer, then closes
                    return
                try:
                    argv, self.held = (self.held, None) if self.held is not None else \
                        (self.parser.next_command(), None)
                except RespProtocolError as e:
                    if e.reply:
                        out.append(encode_error(e.message))
                    self._write(out)
                    self.transport.close()
                    return
                if argv is None:
                    self._memory_settle()
                    if out:
                        self._write(out)
                        out, size = [], 0
                    if self._eof:
                        self.transport.close()
                        return
                    if self._reading_paused:
                        self._reading_paused = False
                        self._sync_reading()
                    self._waiting = True
                    self._data.clear()
                    await self._data.wait()
                    self._waiting = False
                    continue
                if self.multi is None and is_blocking_form(argv):
                    if self._eof:                     # it would block a client that is gone
                        self._write(out)
                        self.transport.close()
                        return
                    if out:
                        self._write(out)              # do not hold replies while blocked
                        out, size = [], 0
                write = plain_write(self, argv)
                if write is not None:             # with the plain writes behind it: one submission
                    replies = await run_writes(self, write)
                else:
                    replies = (await self.execute(argv),)
                self._memory_settle()             # the command's bytes go back with its reply
                if self.closed:
                    return
                if self._abandon:
                    self._write(out)
                    self.transport.close()
                    return
                out.extend(replies)
                size += sum(map(len, replies))
                if self._quit:
                    self._write(out)
                    self.transport.close()
                    return
                if size >= _FLUSH_BYTES:
                    self._write(out)
                    out, size = [], 0
        except Exception:
            log.exception("client %d: command loop failed", self.id)
            if not self.closed:
                self.transport.abort()

    def _write(self, out):
        if self.closed or not out:
            return
        self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        pending = self.transport.get_write_buffer_size()
        lim = self.server.limits
        if pending > lim.output_soft_limit:
            now = time.monotonic()
            if self._soft_since is None:
                self._soft_since = now
            if pending > lim.output_buffer_limit or now - self._soft_since > lim.output_soft_seconds:
                log.warning("client %d (%s): output buffer %d bytes over the limit: closing",
                            self.id, self.addr, pending)
                self.closed = True
                self.transport.abort()
        else:
            self._soft_since = None

    def encode(self, value) -> bytes:
        if isinstance(value, EngineError):
            return encode_error(value.message)
        if type(value) is Verbatim:
            return encode_verbatim(bytes(value), self.proto)
        return encode_reply(value, self.proto)

    async def execute(self, argv) -> bytes:
        stats = self.server.request_stats
        if stats is None:
            return await self._execute(argv)
        t0 = time.perf_counter()
        try:
            return await self._execute(argv)
        finally:
            # Blocking commands count their wait too (redis's latency of a BLPOP includes it).
            stats.observe(bytes(argv[0][:32]).lower().decode("latin-1"), time.perf_counter() - t0)

    async def _execute(self, argv) -> bytes:
        self.last_active = time.monotonic()
        try:
            # XREAD/XREADGROUP replies are engine PairMaps: encode_reply sends them as a
            # RESP3 map (a key named twice appears twice, as in redis) and as pairs in RESP2.
            return self.encode(await self._dispatch(argv))
        except EngineError as e:
            return encode_error(e.message)
        except BackendError as e:
            return encode_error(error_reply_text(e))
        except WaiterClosed:
            self._abandon = True
            return b""
        finally:
            # ASKING holds for the next command only, or through a MULTI (redis resetClient).
            if self.asking and self.multi is None and bytes(argv[0]).lower() != b"asking":
                self.asking = False

    # -- dispatch -------------------------------------------------------------------------
    async def _dispatch(self, argv):
        name = bytes(argv[0]).lower()
        cmd = name.decode("latin-1")
        # CLIENT LIST's cmd= field: redis names a container command with its subcommand.
        self.last_cmd = (cmd + "|" + bytes(argv[1][:32]).lower().decode("latin-1")
                         if name in _CONTAINERS and len(argv) > 1 else cmd)
        if name in SERVER_HANDLERS:
            arity = SERVER_COMMANDS[cmd][0]
            if (arity > 0 and len(argv) != arity) or (arity < 0 and len(argv) < -arity):
                return self._reject(wrong_arity(cmd))
            if not self.authenticated and name not in _NO_AUTH:
                return self._reject(CommandError(noauth_message()))
            if self.multi is not None and name not in _NOT_QUEUED:
                if name in _CONNECTION_FLAGS:
                    return self._queue(argv, local=name)
                if name == b"config" and bytes(argv[1]).lower() == b"set":
                    try:
                        queue_check(argv)         # CONFIG SET's arity error is a queue-time error
                    except EngineError as e:
                        return self._reject(e)
                    local = [bytes(argv[i]) for i in range(2, len(argv) - 1, 2)
                             if bytes(argv[i]).lower() in NODE_SETTINGS]
                    if local:                     # applied on this node, not in the log
                        return self._reject(CommandError(
                            "ERR xraft: CONFIG SET of node setting '%s' cannot be queued in MULTI"
                            % local[0].decode("utf-8", "replace")))
                    return self._queue(argv)
                return self._reject(CommandError("ERR xraft: '%s' cannot be queued in MULTI" % cmd))
            return await SERVER_HANDLERS[name](self, argv)
        try:
            spec = lookup(argv)
        except EngineError as e:
            return self._reject(e)
        if not self.authenticated:
            return self._reject(CommandError(noauth_message()))
        backend = self.server.backend
        try:
            slot = common_slot(command_keys(spec, argv))
        except CrossSlot as e:            # before any redirect, as redis: nothing runs
            return self._reject(e)
        moved = redirect_slot(backend, slot)
        linearizable = True
        if moved is not None and self.readonly and not spec.is_write and follower_read_allowed(backend, slot):
            moved, linearizable = None, False   # READONLY: a follower serves the read, maybe stale
        if self.multi is not None:
            return self._reject(CommandError(moved)) if moved else self._queue(argv)
        if moved is not None:
            return CommandError(moved)
        if name == b"ping" and len(argv) <= 2:
            return PONG if len(argv) == 1 else bytes(argv[1])
        registry = self.server.registry
        if spec.is_write:
            resolved = resolve_command(0, 0, argv)
            if resolved.plan is not None:
                return await self._blocked(run_blocking_write(backend, registry, resolved, self))
            return (await backend.submit([resolved.request]))[0]
        if name == b"xread" and is_blocking_form(argv):
            args = parse_xread_args(argv, False)
            return await self._blocked(run_blocking_read(backend, registry, argv, list(dict.fromkeys(args.keys)),
                                                         args.timeout_ms, linearizable, self))
        return await backend.read(argv, linearizable)

    async def _blocked(self, coro):
        self.blocked = True
        try:
            return await coro
        finally:
            self.blocked = False

    def _reject(self, err: EngineError):
        """An error while MULTI is open also dooms the transaction (redis flagTransaction)."""
        if self.multi is not None:
            self.multi.failed = True
        return err

    def _queue(self, argv, local: bytes = None):
        multi = self.multi
        if multi.failed:
            # redis queueMultiCommand: a doomed transaction stores nothing more (it
            # still answers QUEUED), so EXEC routes only what came before the error.
            return QUEUED
        if len(multi.commands) + len(multi.local) >= self.server.limits.max_queued_commands:
            return self._reject(CommandError("ERR xraft: too many commands queued in MULTI (limit %d)"
                                             % self.server.limits.max_queued_commands))
        if local is not None:
            multi.local.append((len(multi.commands) + len(multi.local), local))
        else:
            multi.commands.append(tuple(bytes(a) for a in argv))
        return QUEUED

    # -- server commands -------------------------------------------------------------------
    def _check_password(self, user: bytes, password: bytes) -> bool:
        required = self.server.requirepass
        if user != b"default":
            return False
        if required is None:
            return True                           # the default user is "nopass"
        return hmac.compare_digest(password, required)

    def _set_authenticated(self):
        self.authenticated = True
        self.parser.authenticated = True

    async def cmd_auth(self, argv):
        if len(argv) > 3:
            return syntax_error()
        if len(argv) == 2:
            if self.server.requirepass is None:
                return CommandError(ERR_NOPASS)
            user, password = b"default", bytes(argv[1])
        else:
            user, password = bytes(argv[1]), bytes(argv[2])
        if not self._check_password(user, password):
            return EngineError(ERR_WRONGPASS)
        self._set_authenticated()
        return OK

    async def cmd_hello(self, argv):
        ver = None
        if len(argv) >= 2:
            ver = string2ll(bytes(argv[1]))
            if ver is None:
                return CommandError("ERR Protocol version is not an integer or out of range")
            if ver < 2 or ver > 3:
                return EngineError("NOPROTO unsupported protocol version")
        j = 2
        while j < len(argv):
            opt = bytes(argv[j]).lower()
            more = len(argv) - 1 - j
            if opt == b"auth" and more >= 2:
                if not self._check_password(bytes(argv[j + 1]), bytes(argv[j + 2])):
                    return EngineError(ERR_WRONGPASS)
                self._set_authenticated()
                j += 3
            elif opt == b"setname" and more:
                err = self.set_name(bytes(argv[j + 1]))
                if err is not None:
                    return err
                j += 2
            else:
                return CommandError("ERR Syntax error in HELLO option '%s'"
                                    % bytes(argv[j]).decode("utf-8", "replace"))
        if not self.authenticated:
            return EngineError(ERR_HELLO_NOAUTH)
        if ver is not None:
            self.proto = ver
        return {b"server": b"redis", b"version": REDIS_VERSION.encode(), b"proto": self.proto,
                b"id": self.id, b"mode": b"cluster",
                b"role": b"master" if self.server.backend.is_leader() else b"replica",
                b"modules": []}

    def set_name(self, name: bytes):
        err = check_name(name)
        if err is None:
            self.name = name or None
        return err

    def info_line(self) -> str:
        return info_line(self)

    async def cmd_client(self, argv):
        return client_command(self, argv)

    async def cmd_select(self, argv):
        db = string2ll(bytes(argv[1]))
        if db is None:
            return not_integer()
        return OK if db == 0 else CommandError("ERR DB index is out of range")

    async def cmd_quit(self, argv):
        self._quit = True
        return OK

    async def cmd_reset(self, argv):
        self.multi = None
        self.watched = {}
        self.readonly = False
        self.asking = False
        self.name = None
        self.proto = 2
        if self.server.requirepass is not None:
            self.authenticated = False
            self.parser.authenticated = False
        return Status("RESET")

    async def cmd_multi(self, argv):
        if self.multi is not None:
            return CommandError("ERR MULTI calls can not be nested")
        self.multi = _Multi()
        return OK

    async def cmd_discard(self, argv):
        if self.multi is None:
            return CommandError("ERR DISCARD without MULTI")
        self.multi = None
        self.watched = {}
        return OK

    async def cmd_exec(self, argv):
        if self.multi is None:
            return CommandError("ERR EXEC without MULTI")
        multi, self.multi = self.multi, None
        watched, self.watched = self.watched, {}
        try:
            # redis routes EXEC by the keys of every queued command together, in
            # processCommand, so before execCommand's EXECABORT of a flagged queue.
            moved = redirect_slot(self.server.backend, transaction_slot(multi.commands))
        except CrossSlot as e:
            return e
        if moved is not None:
            return CommandError(moved)
        if multi.failed:
            return EngineError(EXECABORT_TEXT)
        if not multi.commands and not watched:
            result = []
        else:
            # Watched keys: the fsm compares their versions with these indices when
            # it applies the transaction (fsm/watch.py), on whichever leader that is.
            request = resolve_transaction(0, 0, multi.commands, list(watched.items()))
            result = (await self.server.backend.submit([request]))[0]
        if multi.local and isinstance(result, list):       # not aborted
            for position, name in multi.local:             # ascending: each lands at its own place
                result.insert(position, await SERVER_HANDLERS[name](self, [name]))
        return result

    async def cmd_watch(self, argv):
        if self.multi is not None:
            return CommandError("ERR WATCH inside MULTI is not allowed")
        keys = [bytes(k) for k in argv[1:]]
        backend = self.server.backend
        moved = redirect(backend, keys)
        if moved is not None:
            return CommandError(moved)
        new = [k for k in dict.fromkeys(keys) if k not in self.watched]
        if len(self.watched) + len(new) > MAX_WATCHED_KEYS:
            return CommandError("ERR xraft: too many watched keys (limit %d)" % MAX_WATCHED_KEYS)
        # Every entry up to this index is applied here, so the client's reads
        # after this WATCH see them; any later change of a key aborts its EXEC.
        index = backend.applied_index(keys)        # the keys' group's (one group: the node's)
        for k in new:
            self.watched[k] = index                # a key watched again keeps its first index
        return OK

    async def cmd_unwatch(self, argv):
        self.watched = {}
        return OK

    async def cmd_function(self, argv):
        return function_command(argv)

    async def cmd_debug(self, argv):
        return await debug_command(argv)

    async def cmd_asking(self, argv):
        self.asking = True
        return OK

    async def cmd_readonly(self, argv):
        self.readonly = True
        return OK

    async def cmd_readwrite(self, argv):
        self.readonly = False
        return OK

    async def cmd_info(self, argv):
        sections = [bytes(a).decode("latin-1").lower() for a in argv[1:]]
        dbsize = await self.server.backend.read([b"DBSIZE"], False)
        return Verbatim(info_text(self.server, sections, dbsize if isinstance(dbsize, int) else 0))

    async def cmd_config(self, argv):
        sub = bytes(argv[1]).lower()
        if sub == b"get":
            return config_get(self.server, argv)
        if sub == b"set":
            queue_check(argv)                      # arity, as redis: 'config|set'
            # Engine and node settings are checked together (all or nothing);
            # the engine's go through the log, the node's are set here after.
            _, local = parse_config_set_with(argv, NODE_SETTINGS)
            engine = [bytes(a) for i in range(2, len(argv) - 1, 2) if is_engine_setting(argv[i])
                      for a in (argv[i], argv[i + 1])]
            if engine:
                request = resolve_config_set(0, 0, list(argv[:2]) + engine)
                reply = (await self.server.backend.submit([request]))[0]
                if isinstance(reply, EngineError):
                    return reply
            apply_node_settings(self.server, local)
            return OK
        if sub == b"resetstat" and len(argv) == 2:
            return OK
        return CommandError("ERR unknown subcommand '%s'. Try CONFIG HELP."
                            % bytes(argv[1])[:128].decode("utf-8", "replace"))

    async def cmd_command(self, argv):
        return command_command(argv)

    async def cmd_cluster(self, argv):
        return await cluster_reply(self.server.backend, argv, self.proto, follower_read=self.readonly)


SERVER_HANDLERS = {name.encode(): getattr(Client, "cmd_" + name) for name in SERVER_COMMANDS}


class RespServer:
    def __init__(self, backend, host: str = "127.0.0.1", port: int = 0, *, requirepass=None,
                 limits: ServerLimits = None, client_memory: ClientMemory = None):
        self.backend = backend
        self.host = host
        self.port = port
        self.requirepass = requirepass.encode() if isinstance(requirepass, str) else requirepass
        self.limits = limits or ServerLimits()
        # Node-wide bytes of client requests (client_memory.py), shared with the gRPC service.
        self.client_memory = client_memory or ClientMemory()
        self.registry = BlockingRegistry(self.limits.max_blocked_clients)
        self.clients = {}
        self.node_settings = {}           # node_config.py: settings CONFIG SET gave this node
        self.started = time.monotonic()
        self.stats_connections = 0
        self.stats_rejected = 0
        self.request_stats = None         # request_stats.RequestStats when the node serves --metrics
        self._ids = 0
        self._server = None
        self.draining = False
        self._gone = asyncio.Event()      # set when the last client's connection is lost
        backend.add_ready_listener(self.registry.on_ready)
        backend.add_role_listener(self._role_changed)

    def next_client_id(self) -> int:
        self._ids += 1
        return self._ids

    async def start(self):
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Client(self), self.host, self.port,
                                                reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self.backend.advertise(self.host, self.port)
        return self

    def _role_changed(self):
        """Leadership moved: blocked clients on keys this node no longer serves get a
        redirect now; a silent empty reply would read as "nothing arrived"."""
        self.registry.fail_where(self._redirect_for)

    def _redirect_for(self, w):
        backend = self.backend
        msg = redirect(backend, w.keys)
        if msg is None and not backend.is_leader():
            msg = not_leader_message(backend.leader_address())
        return BackendError(msg) if msg else None

    def client_gone(self, client) -> None:
        if self.clients.get(client.id) is client:
            del self.clients[client.id]
        if not self.clients:
            self._gone.set()

    async def shutdown(self, timeout_s: float) -> bool:
        """Graceful close (module doc); True if every client closed cleanly in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        self.draining = True
        if self._server is not None:
            self._server.close()          # no new connections
        # Where to go instead, if this node knows (it handed leadership over); else UNAVAILABLE.
        self.registry.fail_where(lambda w: self._redirect_for(w)
                                 or BackendError(unavailable_message("shutting down")))
        clients = list(self.clients.values())
        for c in clients:
            c.drain()
        tasks = [c._task for c in clients if c._task is not None and not c._task.done()]
        if tasks:
            # A command still running (a write waiting for its outcome) gets the rest of the time.
            await asyncio.wait(tasks, timeout=max(deadline - loop.time(), 0.0))
        for c in list(self.clients.values()):
            if c.transport is not None and not c.transport.is_closing():
                c.transport.close()
        if self.clients:
            self._gone.clear()
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                    await self._gone.wait()
            except asyncio.TimeoutError:
                pass
        clean = not self.clients
        if not clean:
            log.warning("%d RESP client(s) still open after %.1fs: closing them", len(self.clients), timeout_s)
        await self.close()
        return clean

    async def close(self):
        if self._server is not None:
            self._server.close()
        for c in list(self.clients.values()):
            if c.transport is not None:
                c.transport.abort() if self.draining else c.transport.close()
            if c._task is not None:
                c._task.cancel()
        if self._server is not None:
            await self._server.wait_closed()


def main(argv=None):
    """Single-node dev mode: one LocalBackend, no Raft."""
    ap = argparse.ArgumentParser(description="xraft RESP server over a local state machine (no Raft)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=6379)
    ap.add_argument("--requirepass", default=None)
    ap.add_argument("--maxclients", type=int, default=10_000)
    args = ap.parse_args(argv)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def serve():
        server = RespServer(LocalBackend(), args.host, args.port, requirepass=args.requirepass,
                            limits=ServerLimits(max_clients=args.maxclients))
        await server.start()
        log.warning("xraft RESP server (local backend) on %s:%d", args.host, server.port)
        await asyncio.Event().wait()

    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve())


if __name__ == "__main__":
    main()
