"""The nemesis workload's RESP client records what certainly did not happen as a fail."""
import random
import socket
import threading

import pytest

from xraft.ops import nemesis_workload as nw


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_refused_connect_is_a_fail_the_command_was_never_sent():
    r = nw.Resp(["127.0.0.1:%d" % _closed_port()], random.Random(1))
    with pytest.raises(nw.Failed, match="Connection refused"):
        r.call("XADD", "k", "*", "v", "1")


def test_a_connection_dropped_after_the_command_went_out_is_unknown():
    """A server that accepts, reads the command and closes: it may have applied it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def serve():
        conn, _ = srv.accept()
        while True:                     # the client's hand-shake (CLIENT SETINFO ...) gets +OK
            data = conn.recv(4096)
            got.append(data)
            if not data or b"XADD" in data:
                break
            conn.sendall(b"+OK\r\n" * data.count(b"*"))
        conn.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        r = nw.Resp(["127.0.0.1:%d" % srv.getsockname()[1]], random.Random(1))
        with pytest.raises(nw.Unknown):
            r.call("XADD", "k", "*", "v", "1")
        t.join(5)
        assert any(b"XADD" in d for d in got), got
    finally:
        srv.close()
