"""The SDK over TLS against a real node-side gRPC server (XRaftService over a
LocalBackend on a TLS port, credentials from the node's TlsConfig, as node_main
builds them): a CA-only client writes and reads with its bearer token, a
plaintext client gets a typed error (no hang), server_name_override is applied,
and a node requiring client certificates accepts the SDK with one."""
import asyncio
import contextlib
import shutil
import subprocess
import time

import grpc
import pytest

from tests.client import run
from xraft.client import errors, sync
from xraft.client.aio import Client
from xraft.node.runtime.grpc_transport import TlsConfig
from xraft.node.server.backend import LocalBackend
from xraft.node.server.grpc_service import XRaftService
from xraft.proto.v1 import client_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """PEM bytes: a CA, a node certificate (IP:127.0.0.1, DNS:xraft-node) and a
    client certificate, both signed by the CA; plus a second, unrelated CA."""
    d = tmp_path_factory.mktemp("pki")

    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        ossl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=xraft-{ca}")
    (d / "node.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:xraft-node\n")
    (d / "client.cnf").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("node", "client"):
        ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.cnf")
    return {f: (d / f).read_bytes() for f in ("ca.pem", "other-ca.pem", "node.pem", "node.key",
                                               "client.pem", "client.key")}


@contextlib.asynccontextmanager
async def tls_serving(pki, *, require_client_cert=False, token=TOKEN):
    """The address of a started client-API server on a TLS port; stopped on exit."""
    tls = TlsConfig(pki["node.pem"], pki["node.key"], pki["ca.pem"], require_client_cert=require_client_cert)
    server = grpc.aio.server()
    pb_grpc.add_XRaftServicer_to_server(XRaftService(LocalBackend(), token=token), server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _write_read(client):
    sid = await client.xadd("orders", {"item": "book"})
    entries = await client.xrange("orders")
    assert [e.id for e in entries] == [sid]
    assert dict(entries[0].fields) == {b"item": b"book"}


async def _fails_fast(client, op=lambda c: c.xlen("orders"), within=5.0):
    """A failed TLS session: the connection's UnavailableError, retried until
    the client's timeout, then DeadlineExceededError -- never a hang."""
    start = time.monotonic()
    with pytest.raises(errors.DeadlineExceededError) as ei:
        await op(client)
    assert time.monotonic() - start < within
    assert isinstance(ei.value.__cause__, errors.UnavailableError)
    return ei.value


def test_ca_only_client_writes_and_reads_with_its_token(pki):
    async def body():
        async with tls_serving(pki) as addr:
            async with Client([addr], token=TOKEN, root_certificates=pki["ca.pem"]) as c:
                assert c._credentials is not None            # tls defaults on with TLS options
                await _write_read(c)
                # The subscription stream goes over the same secure channel.
                async for key, entries in c.subscribe({"orders": "0-0"}):
                    assert key == b"orders" and len(entries) == 1
                    break
            # Explicit tls=True with a ready ChannelCredentials is the same thing.
            creds = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"])
            async with Client(addr, token=TOKEN, tls=True, credentials=creds) as c:
                assert await c.xlen("orders") == 1
            # The token is still checked over TLS.
            async with Client(addr, token="wrong", root_certificates=pki["ca.pem"], timeout=2) as c:
                with pytest.raises(errors.NoAuthError):
                    await c.xlen("orders")
    run(body)


def test_sync_client_over_tls(pki):
    async def body():
        async with tls_serving(pki) as addr:
            def blocking():
                with sync.Client([addr], token=TOKEN, root_certificates=pki["ca.pem"]) as c:
                    sid = c.xadd("s", {"f": "v"})
                    return sid, c.xrange("s")
            sid, entries = await asyncio.to_thread(blocking)
            assert [e.id for e in entries] == [sid]
    run(body)


def test_tls_mismatches_are_typed_errors_not_hangs(pki):
    async def body():
        async with tls_serving(pki) as addr:
            # Plaintext against the TLS port.
            async with Client([addr], token=TOKEN, timeout=1.5) as c:
                await _fails_fast(c)
            # A write is never sent, so it is no unknown outcome, even without request ids.
            async with Client([addr], token=TOKEN, timeout=1.5, request_ids=False) as c:
                await _fails_fast(c, lambda c: c.xadd("orders", {"f": "v"}))
            # A CA that did not sign the node's certificate.
            async with Client([addr], token=TOKEN, root_certificates=pki["other-ca.pem"], timeout=1.5) as c:
                await _fails_fast(c)
            # server_name_override is applied: a name not in the certificate fails...
            async with Client([addr], token=TOKEN, root_certificates=pki["ca.pem"], timeout=1.5,
                              server_name_override="not-the-node") as c:
                await _fails_fast(c)
            # ...and the certificate's DNS name works although the node is dialled by IP.
            async with Client([addr], token=TOKEN, root_certificates=pki["ca.pem"],
                              server_name_override="xraft-node") as c:
                assert await c.xlen("orders") == 0
    run(body)


def test_required_client_certificates(pki):
    async def body():
        async with tls_serving(pki, require_client_cert=True) as addr:
            async with Client([addr], token=TOKEN, root_certificates=pki["ca.pem"], timeout=1.5) as c:
                await _fails_fast(c)                           # no certificate: no TLS session
            async with Client([addr], token=TOKEN, root_certificates=pki["ca.pem"],
                              client_cert=pki["client.pem"], client_key=pki["client.key"]) as c:
                await _write_read(c)
    run(body)


def test_tls_option_checks():
    ca = b"-----BEGIN CERTIFICATE-----\n"
    with pytest.raises(ValueError, match="tls=False"):
        Client("a:1", tls=False, root_certificates=ca)
    with pytest.raises(ValueError, match="go together"):
        Client("a:1", root_certificates=ca, client_cert=b"x")
    with pytest.raises(ValueError, match="excludes"):
        Client("a:1", credentials=grpc.ssl_channel_credentials(), root_certificates=ca)
    with pytest.raises(TypeError, match="PEM bytes"):
        Client("a:1", root_certificates="/path/to/ca.pem")
    assert Client("a:1")._credentials is None
    assert Client("a:1", tls=True)._credentials is not None    # grpc's default roots
