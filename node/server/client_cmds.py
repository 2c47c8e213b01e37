"""CLIENT: ID, GETNAME, SETNAME, INFO, LIST, KILL, UNBLOCK, with redis 7.0's replies and errors.

Checked against redis-server 7.0.15 (networking.c clientCommand,
catClientInfoString). A CLIENT LIST line carries the fields redis prints, in
its order; those xraft does not measure the way redis does (argv-mem,
multi-mem, rbs, rbp, tot-mem) are reported as 0, and every client is a
"normal" client of user "default" on db 0 (xraft has no pub/sub, replicas
connected as clients, ACL users or other databases).

CLIENT UNBLOCK lives with the blocked clients (blocking.client_unblock).
"""
import time

from ..engine.errors import CommandError, syntax_error, wrong_arity
from ..engine.replies import OK
from ..engine.streamid import string2ll
from .blocking import client_unblock
from .cluster_cmds import Verbatim

ERR_BAD_NAME = "ERR Client names cannot contain spaces, newlines or special characters."
_CLIENT_TYPES = (b"normal", b"slave", b"replica", b"pubsub", b"master")
_LONG_MAX = (1 << 63) - 1


def format_addr(sockaddr) -> str:
    """redis's "ip:port" (connFormatAddr: "[ip]:port" for IPv6), as CLIENT LIST/KILL use."""
    if not sockaddr:
        return ""
    host, port = sockaddr[:2]
    return ("[%s]:%s" if ":" in host else "%s:%s") % (host, port)


def check_name(name: bytes):
    """redis validateClientName: printable ASCII without spaces; None if fine."""
    if any(c < 0x21 or c > 0x7E for c in name):
        return CommandError(ERR_BAD_NAME)
    return None


def _flags(client) -> str:
    """redis's flag letters for what xraft tracks (catClientInfoString order)."""
    out = ""
    if client.multi is not None:
        out += "x"
    if client.blocked:
        out += "b"
    if client.readonly:
        out += "r"
    return out or "N"


def info_line(client) -> str:
    now = time.monotonic()
    multi = client.multi
    closed = client.closed or client.transport is None
    return ("id=%d addr=%s laddr=%s fd=%d name=%s age=%d idle=%d flags=%s db=0 sub=0 psub=0 ssub=0 "
            "multi=%d qbuf=%d qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=%d "
            "tot-mem=0 events=r cmd=%s user=default redir=-1 resp=%d\n") % (
        client.id, client.addr, client.laddr, client.fd, (client.name or b"").decode("latin-1"),
        now - client.created, now - client.last_active, _flags(client),
        len(multi.commands) if multi is not None else -1,
        client.parser.buffered_bytes if client.parser is not None else 0,
        0 if closed else client.transport.get_write_buffer_size(), client.last_cmd, client.proto)


def _client_type_ok(arg: bytes):
    if arg.lower() not in _CLIENT_TYPES:
        return CommandError("ERR Unknown client type '%s'" % arg.decode("utf-8", "replace"))
    return None


def client_list(client, argv):
    clients = client.server.clients
    n = len(argv)
    wanted = None
    if n == 4 and bytes(argv[2]).lower() == b"type":
        err = _client_type_ok(bytes(argv[3]))
        if err is not None:
            return err
        if bytes(argv[3]).lower() != b"normal":
            return Verbatim(b"")                 # every xraft client is a normal one
    elif n > 3 and bytes(argv[2]).lower() == b"id":
        wanted = []
        for a in argv[3:]:
            cid = string2ll(bytes(a))
            if cid is None:
                return CommandError("ERR Invalid client ID")
            wanted.append(cid)
    elif n != 2:
        return syntax_error()
    if wanted is None:
        chosen = list(clients.values())
    else:
        chosen = [clients[cid] for cid in wanted if cid in clients]
    return Verbatim("".join(info_line(c) for c in chosen).encode())


def client_kill(client, argv):
    """CLIENT KILL addr | CLIENT KILL <filter> <value> ... (redis 7.0 clientCommand)."""
    n = len(argv)
    addr = laddr = None
    cid = 0
    skipme = True
    if n == 3:
        addr = bytes(argv[2]).decode("latin-1")
        skipme = False                        # the old form may kill the caller
    else:
        i = 2
        while i < n:
            opt = bytes(argv[i]).lower()
            more = n > i + 1
            val = bytes(argv[i + 1]) if more else b""
            if opt == b"id" and more:
                cid = string2ll(val)
                if cid is None or not 1 <= cid <= _LONG_MAX:
                    return CommandError("ERR client-id should be greater than 0")
            elif opt == b"type" and more:
                err = _client_type_ok(val)
                if err is not None:
                    return err
                if val.lower() != b"normal":
                    return 0                  # no client of another type exists here
            elif opt == b"addr" and more:
                addr = val.decode("latin-1")
            elif opt == b"laddr" and more:
                laddr = val.decode("latin-1")
            elif opt == b"user" and more:
                if val != b"default":
                    return CommandError("ERR No such user '%s'" % val.decode("utf-8", "replace"))
            elif opt == b"skipme" and more:
                if val.lower() == b"yes":
                    skipme = True
                elif val.lower() == b"no":
                    skipme = False
                else:
                    return syntax_error()
            else:
                return syntax_error()
            i += 2
    killed = 0
    for other in list(client.server.clients.values()):
        if addr is not None and other.addr != addr:
            continue
        if laddr is not None and other.laddr != laddr:
            continue
        if cid and other.id != cid:
            continue
        if other is client and skipme:
            continue
        if other is client:
            client.close_after_reply()
        else:
            other.kill()
        killed += 1
    if n == 3:
        return OK if killed else CommandError("ERR No such client")
    return killed


def _client_id(client, argv):
    return client.id


def _client_getname(client, argv):
    return client.name


def _client_setname(client, argv):
    err = client.set_name(bytes(argv[2]))
    return OK if err is None else err


def _client_info(client, argv):
    return Verbatim(info_line(client).encode())


# subcommand -> (arity as redis's client|<sub> has it, handler(client, argv))
SUBCOMMANDS = {
    b"id": (2, _client_id),
    b"getname": (2, _client_getname),
    b"setname": (3, _client_setname),
    b"info": (2, _client_info),
    b"list": (-2, client_list),
    b"kill": (-3, client_kill),
    b"unblock": (-3, lambda client, argv: client_unblock(client.server.registry, client.server.clients, argv)),
}


def client_command(client, argv):
    sub = bytes(argv[1]).lower()
    entry = SUBCOMMANDS.get(sub)
    if entry is None:
        return CommandError("ERR unknown subcommand '%s'. Try CLIENT HELP."
                            % bytes(argv[1])[:128].decode("utf-8", "replace"))
    arity, handler = entry
    n = len(argv)
    if (arity > 0 and n != arity) or (arity < 0 and n < -arity):
        return wrong_arity("client|" + sub.decode())
    return handler(client, argv)
