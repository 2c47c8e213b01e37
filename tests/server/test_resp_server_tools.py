"""redis-cli and redis-benchmark, unchanged, against the RESP server.

redis-benchmark's figures (and redis-server's under the same run) are printed;
run with -s to see them. They are not asserted: the machine is shared."""
import re
import shutil
import subprocess

import pytest

from tests.server.test_resp_server import srv  # noqa: F401  (fixture)

pytestmark = pytest.mark.redis

CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
BENCH = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"


def cli(port, *args, stdin=None):
    out = subprocess.run([CLI, "-p", str(port), *args], input=stdin, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode()


def test_redis_cli(srv, redis):
    assert cli(srv.port, "PING") == "PONG\n"
    for port in (redis.port, srv.port):
        assert cli(port, "RPUSH", "l", "a", "b", "c") == "3\n"
        assert cli(port, "XADD", "s", "1-1", "f", "v") == "1-1\n"
    assert cli(srv.port, "LRANGE", "l", "0", "-1") == "a\nb\nc\n"
    assert cli(srv.port, "XRANGE", "s", "-", "+") == "1-1\nf\nv\n"
    assert cli(srv.port, "NOSUCH") == "ERR unknown command 'NOSUCH', with args beginning with: \n\n"
    assert "redis_version:7.0.15" in cli(srv.port, "INFO", "server")
    for args in [("-3", "LPOP", "nosuch"), ("-3", "HELLO", "3"), ("-3", "XREAD", "STREAMS", "s", "0"),
                 ("BLPOP", "nosuch", "0.05"), ("LPOP", "nosuch"), ("CONFIG", "GET", "list-compress-depth")]:
        theirs, ours = cli(redis.port, *args), cli(srv.port, *args)
        if args[1] == "HELLO":                       # the client id differs
            theirs, ours = re.sub(r"id \d+", "", theirs), re.sub(r"id \d+", "", ours)
            theirs = theirs.replace("standalone", "cluster")
        assert ours == theirs, args
    assert cli(srv.port, "CLUSTER", "KEYSLOT", "foo") == "12182\n"
    # Several commands on one connection, from stdin (pipelined by redis-cli).
    assert cli(srv.port, stdin=b"LLEN l\nXLEN s\nTYPE s\n") == "3\n1\nstream\n"


def _bench(port):
    out = subprocess.run([BENCH, "-p", str(port), "-t", "ping,lpush", "-n", "2000", "-q"],
                         capture_output=True, timeout=120)
    text = out.stdout.decode(errors="replace").replace("\r", "\n")
    assert out.returncode == 0, out.stderr
    figures = dict(re.findall(r"^(\S+): ([\d.]+) requests per second", text, re.M))
    return figures, text + out.stderr.decode(errors="replace")


def test_redis_benchmark(srv, redis):
    ours, text = _bench(srv.port)
    assert set(ours) == {"PING_INLINE", "PING_MBULK", "LPUSH"}, text
    assert "rror" not in text, text
    assert srv.client().llen("mylist") == 2000       # every LPUSH applied
    theirs, _ = _bench(redis.port)
    print("\nredis-benchmark -t ping,lpush -n 2000 -q (requests/s)   xraft   redis-server")
    for name in ("PING_INLINE", "PING_MBULK", "LPUSH"):
        print("  %-12s %10s %10s" % (name, ours[name], theirs.get(name)))


def test_redis_py_optimistic_transactions(srv, redis):
    """redis-py's WATCH/MULTI/EXEC helper (Redis.transaction): a concurrent write
    aborts the first attempt (WatchError inside, retried), as against redis."""
    import redis as redispy
    outcomes = []
    for port in (redis.port, srv.port):
        r, other = redispy.Redis(port=port), redispy.Redis(port=port)
        r.set("counter", "0")
        seen = []

        def incr(pipe):
            value = int(pipe.get("counter"))
            seen.append(value)
            if len(seen) == 1:
                other.set("counter", "100")          # another client writes between WATCH and EXEC
            pipe.multi()
            pipe.set("counter", value + 1)

        assert r.transaction(incr, "counter") == [True]
        outcomes.append((seen, r.get("counter")))
        r.close()
        other.close()
    assert outcomes[1] == outcomes[0] == ([0, 100], b"101")
