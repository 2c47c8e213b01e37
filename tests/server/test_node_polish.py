"""The node's integration seams: server-level commands over gRPC Execute, TLS without
client certificates on the shared port, the RESP server's graceful shutdown, and the
one name of the peer secret's environment variable."""
import asyncio
import logging
import shutil
import subprocess

import grpc
import pytest

from tests.client import run, serving
from tests.runtime.test_grpc_transport import CLUSTER, FAST, SECRET, Recorder, app, wait_until
from xraft.node.runtime import peer_auth
from xraft.node.runtime.grpc_transport import GrpcTransport, TlsConfig, server_options
from xraft.node.server import node_main
from xraft.node.server.backend import LocalBackend
from xraft.node.server.config import ConfigError, parse_args
from xraft.node.server.grpc_service import XRaftService
from xraft.node.server.resp_server import RespServer
from xraft.proto.v1 import client_pb2 as pb
from xraft.proto.v1 import client_pb2_grpc as pb_grpc


async def execute(stub, *argv):
    return (await stub.Execute(pb.ExecuteRequest(argv=[a.encode() for a in argv]), timeout=5)).reply


# ------------------------------------------------------------------ Execute: server commands


def test_execute_answers_info_ping_cluster_and_command():
    async def body():
        backend = LocalBackend()
        backend.advertise("127.0.0.1", 6379)      # a RESP address: CLUSTER SLOTS names it
        async with serving(backend) as (addr, _, _):
            async with grpc.aio.insecure_channel(addr) as ch:
                stub = pb_grpc.XRaftStub(ch)
                raft = (await execute(stub, "INFO", "raft")).bulk.decode()
                assert raft.startswith("# Raft\r\n")
                fields = dict(line.split(":", 1) for line in raft.split("\r\n")[1:] if line)
                assert fields == {k: str(v) for k, v in backend.raft_info().items()}
                everything = (await execute(stub, "INFO")).bulk.decode()
                assert all(f"# {s}\r\n" in everything for s in ("Server", "Clients", "Replication", "Raft"))
                assert (await execute(stub, "PING")).status == "PONG"
                assert (await execute(stub, "PING", "hi")).bulk == b"hi"
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await execute(stub, "PING", "a", "b")
                assert "wrong number of arguments for 'ping'" in ei.value.details()
                assert (await execute(stub, "CLUSTER", "KEYSLOT", "foo")).integer == 12182
                assert (await execute(stub, "CLUSTER", "MYID")).bulk == backend.node_id.encode()
                slots = (await execute(stub, "CLUSTER", "SLOTS")).array.items
                assert [(s.array.items[0].integer, s.array.items[1].integer) for s in slots] == [(0, 16383)]
                shards = (await execute(stub, "CLUSTER", "SHARDS")).array.items
                assert len(shards) == 1 and shards[0].HasField("map")
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await execute(stub, "CLUSTER")
                assert "wrong number of arguments for 'cluster'" in ei.value.details()
                assert (await execute(stub, "COMMAND", "COUNT")).integer > 30
                # Engine commands still go the engine's way.
                await execute(stub, "XADD", "s", "1-1", "f", "v")
                assert (await execute(stub, "XLEN", "s")).integer == 1
                assert "keys=1" in (await execute(stub, "INFO", "keyspace")).bulk.decode()
    run(body)


def test_info_over_grpc_reports_the_resp_servers_figures():
    async def body():
        backend = LocalBackend()
        resp = RespServer(backend, "127.0.0.1", 0)
        await resp.start()
        server = grpc.aio.server()
        pb_grpc.add_XRaftServicer_to_server(XRaftService(backend, info_server=resp), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            _, w = await asyncio.open_connection("127.0.0.1", resp.port)
            await wait_until(lambda: len(resp.clients) == 1, 5, "the RESP client")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                text = (await execute(pb_grpc.XRaftStub(ch), "INFO", "clients", "server")).bulk.decode()
            assert "connected_clients:1\r\n" in text and f"tcp_port:{resp.port}\r\n" in text
            w.close()
        finally:
            await server.stop(None)
            await resp.close()
    run(body)


# ------------------------------------------------------------------ TLS on the shared port


def _certs(d):
    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=xraft-polish-ca")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:xraft-node\n")
    ossl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "node.pem", "-days", "2", "-extfile", "ext.cnf")
    return [str(d / f) for f in ("node.pem", "node.key", "ca.pem")]


async def _node_port(tls: TlsConfig, peers):
    """Node 1's one gRPC port, as node_main builds it: client API + peers, TLS."""
    t = GrpcTransport(1, CLUSTER, SECRET, "127.0.0.1:0", peers, tls=tls, limits=FAST)
    server = grpc.aio.server(options=server_options(t.limits))
    pb_grpc.add_XRaftServicer_to_server(XRaftService(LocalBackend()), server)
    t.add_to_server(server)
    port = server.add_secure_port("127.0.0.1:0", t.server_credentials())
    await server.start()
    rec = Recorder()
    t.start(rec)
    return t, server, port, rec


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_tls_clients_need_only_the_ca_and_peers_still_authenticate(tmp_path):
    cert, key, ca = _certs(tmp_path)
    ca_pem = (tmp_path / "ca.pem").read_bytes()
    cfg = parse_args(["--id", "1", "--cluster-id", CLUSTER, "--data-dir", str(tmp_path / "d"),
                      "--grpc", "127.0.0.1:7001", "--resp", "127.0.0.1:6001", "--peers", "1=127.0.0.1:7001",
                      "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca])
    assert cfg.tls_require_client_cert is False       # the default: SDK clients have no certificate
    tls = TlsConfig.from_files(cert, key, ca, require_client_cert=cfg.tls_require_client_cert)

    async def body():
        t1, server, port, rec1 = await _node_port(tls, {2: "127.0.0.1:1", 3: "127.0.0.1:1"})
        addr = f"127.0.0.1:{port}"
        t2 = GrpcTransport(2, CLUSTER, SECRET, "127.0.0.1:0", {1: addr}, tls=tls, limits=FAST)
        t3 = GrpcTransport(3, CLUSTER, b"not the cluster's secret, no way", "127.0.0.1:0", {1: addr},
                           tls=tls, limits=FAST)
        t2.start(Recorder())
        t3.start(Recorder())
        try:
            # An SDK client with only the CA.
            creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
            async with grpc.aio.secure_channel(addr, creds) as ch:
                assert (await execute(pb_grpc.XRaftStub(ch), "PING")).status == "PONG"
            # A peer with the secret gets its stream; one with a certificate but not the
            # secret is refused by the HMAC Hello.
            await wait_until(lambda: t2.link_up(1), 10, "node 2's link over TLS")
            assert t2.send(1, [(1, app(2, 1, 1))])
            await wait_until(lambda: rec1.messages(2) == [(1, app(2, 1, 1))], 5, "delivery over TLS")
            await wait_until(lambda: t3.stats.links[1].handshake_failures >= 1, 10, "the bad secret's refusal")
            assert not t3.link_up(1) and t1.stats.inbound.hellos_refused >= 1
            # Plaintext gets nothing from a TLS port.
            async with grpc.aio.insecure_channel(addr) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await execute(pb_grpc.XRaftStub(ch), "PING")
                assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            for t in (t1, t2, t3):
                await t.close()
            await server.stop(None)

    async def mutual():
        strict = TlsConfig.from_files(cert, key, ca, require_client_cert=True)
        t1, server, port, _ = await _node_port(strict, {})
        try:
            creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    await execute(pb_grpc.XRaftStub(ch), "PING")
                assert ei.value.code() == grpc.StatusCode.UNAVAILABLE   # no certificate: no TLS session
            full = grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=tls.private_key,
                                                certificate_chain=tls.cert_chain)
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", full) as ch:
                assert (await execute(pb_grpc.XRaftStub(ch), "PING")).status == "PONG"
        finally:
            await t1.close()
            await server.stop(None)
    run(body)
    run(mutual)


def test_tls_require_client_cert_is_a_checked_flag(tmp_path):
    base = ["--id", "1", "--cluster-id", "c", "--data-dir", str(tmp_path), "--grpc", "127.0.0.1:7001",
            "--resp", "127.0.0.1:6001", "--peers", "1=127.0.0.1:7001"]
    with pytest.raises(ConfigError, match="needs --tls-cert"):
        parse_args(base + ["--tls-require-client-cert"])
    tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"]
    assert parse_args(base + tls + ["--tls-require-client-cert"]).tls_require_client_cert is True
    toml = tmp_path / "n.toml"
    toml.write_text('tls-require-client-cert = "yes"\n')
    with pytest.raises(ConfigError, match="is a flag"):
        parse_args(base + tls + ["--config", str(toml)])


# ------------------------------------------------------------------ RESP graceful shutdown


async def _read_all(reader):
    out = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            return out
        out += chunk


def test_resp_shutdown_finishes_running_commands_flushes_and_closes():
    async def body():
        backend = LocalBackend()
        resp = RespServer(backend, "127.0.0.1", 0)
        await resp.start()
        port = resp.port
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            # Client 1: a pipeline whose second command blocks.
            w1.write(b"XADD s 1-1 f v\r\nBLPOP q 0\r\n")
            assert await r1.readexactly(len(b"$3\r\n1-1\r\n")) == b"$3\r\n1-1\r\n"
            await wait_until(lambda: resp.registry.blocked_clients == 1, 5, "the blocked client")
            assert await resp.shutdown(5.0) is True
            # The blocked command ended with a reply (this node is the leader: nothing to
            # redirect to), which was flushed before the close.
            assert await _read_all(r1) == b"-UNAVAILABLE shutting down\r\n"
            assert await _read_all(r2) == b""                # idle: just closed
            assert not resp.clients
            with pytest.raises(OSError):                     # no longer listening
                await asyncio.open_connection("127.0.0.1", port)
            for w in (w1, w2):
                w.close()
        finally:
            await resp.close()
    run(body)


def test_resp_shutdown_is_bounded_by_its_timeout():
    async def body():
        backend = LocalBackend()
        await backend.submit([_xadd_big(i) for i in range(64)])
        resp = RespServer(backend, "127.0.0.1", 0)
        await resp.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", resp.port, limit=1 << 16)
            # Replies far larger than the socket buffers, never read: they cannot flush.
            w.write(b"XRANGE big - +\r\n" * 16)
            await wait_until(lambda: any(c.transport.get_write_buffer_size() > (1 << 20)
                                         for c in resp.clients.values()), 10, "a stuck output buffer")
            assert await resp.shutdown(0.2) is False
            await wait_until(lambda: not resp.clients, 5, "the stuck client aborted at the deadline")
            w.close()
        finally:
            await resp.close()
    run(body)


def _xadd_big(i):
    from xraft.node.fsm.resolve import resolve_command
    return resolve_command(0, 0, [b"XADD", b"big", b"1-%d" % (i + 1), b"f", b"x" * 16384]).request


# ------------------------------------------------------------------ the peer secret's variable


def test_one_name_for_the_secret_variable_with_the_old_one_as_a_fallback(caplog):
    good, old = "s" * 32, "o" * 32
    assert peer_auth.DEFAULT_SECRET_ENV == "XRAFT_CLUSTER_SECRET" == node_main.SECRET_ENV
    assert peer_auth.load_secret(environ={"XRAFT_CLUSTER_SECRET": good}) == good.encode()
    with caplog.at_level(logging.WARNING, logger="xraft.peer_auth"):
        assert peer_auth.load_secret(environ={"XRAFT_PEER_SECRET": old}) == old.encode()
    assert "deprecated" in caplog.text and "XRAFT_CLUSTER_SECRET" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="xraft.peer_auth"):
        both = {"XRAFT_CLUSTER_SECRET": good, "XRAFT_PEER_SECRET": old}
        assert peer_auth.load_secret(environ=both) == good.encode()
    assert "deprecated" not in caplog.text
    with pytest.raises(peer_auth.SecretError, match=r"\$XRAFT_CLUSTER_SECRET"):
        peer_auth.load_secret(environ={})
    with pytest.raises(peer_auth.SecretError, match="XRAFT_PEER_SECRET"):
        peer_auth.load_secret(environ={"XRAFT_PEER_SECRET": "short"})
    # A caller naming its own variable gets no fallback.
    with pytest.raises(peer_auth.SecretError):
        peer_auth.load_secret(env_var="X_OTHER", environ={"XRAFT_PEER_SECRET": old})


def test_requirepass_needs_a_grpc_token(tmp_path):
    from xraft.node.server.config import ConfigError, parse_args
    base = ["--id", "1", "--cluster-id", "c", "--data-dir", str(tmp_path / "d"), "--grpc", "127.0.0.1:7001",
            "--resp", "127.0.0.1:6001", "--peers", "1=127.0.0.1:7001"]
    with pytest.raises(ConfigError, match="--requirepass protects RESP only.*--token-file"):
        parse_args(base + ["--requirepass", "pw"])
    toml = tmp_path / "node.toml"
    toml.write_text('requirepass = "pw"\n')  # the same rule through a config file
    with pytest.raises(ConfigError, match="--token-file"):
        parse_args(base + ["--config", str(toml)])
    cfg = parse_args(base + ["--requirepass", "pw", "--token-file", str(tmp_path / "t")])
    assert (cfg.requirepass, cfg.initial_cluster_state) == ("pw", "existing")
    assert parse_args(base + ["--initial-cluster-state", "new"]).initial_cluster_state == "new"
