"""`xraftctl local up --metrics-base-port`: every node serves /metrics, and `local status`
shows each follower's lag from the leader's metrics."""
import json
import time

from xraft.ops import local_cluster as lc
from xraft.ops import metrics_scrape
from tests.ops.test_local_cluster import _ctl, _leader, cluster_dir  # noqa: F401 (fixture)


def test_e2e_local_cluster_serves_metrics_and_status_shows_lag(cluster_dir):  # noqa: F811
    base = next(b for b in range(23000, 60000, 89) if all(lc.port_is_free(p) for p in range(b, b + 3)))
    r = _ctl("local", "up", "--dir", cluster_dir, "--nodes", "3", "--groups", "1", "--timeout", "40", "--metrics-base-port", str(base))
    assert r.returncode == 0, r.stdout + r.stderr
    cluster = lc.load(cluster_dir)
    assert [n.metrics for n in cluster.nodes] == [f"127.0.0.1:{base + i}" for i in range(3)]
    rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
    leader = _leader(rows)
    client = lc.resp_client(leader["resp"], 2.0)
    for i in range(10):
        client.xadd("s", {"n": i})
    client.close()
    # A follower applies the writes after the leader acknowledged them: wait (bounded) until
    # every node's applied index shows them, rather than reading it once right away.
    for node in cluster.nodes:
        deadline = time.monotonic() + 20
        while True:
            samples = metrics_scrape.scrape(node.metrics, timeout=5) or []
            applied = [v for name, labels, v in samples if name == "xraft_raft_applied_index"]
            if (applied and applied[0] >= 11) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert applied and applied[0] >= 11, (node.id, applied)
    rows = json.loads(_ctl("local", "status", "--dir", cluster_dir, "--json").stdout)
    lags = {r["id"]: r["lag"] for r in rows}
    assert lags[leader["id"]] == 0
    assert all(isinstance(lag, int) and lag >= 0 for lag in lags.values()), lags
    table = _ctl("local", "status", "--dir", cluster_dir).stdout
    assert table.splitlines()[1].endswith("LAG")
    assert metrics_scrape.scrape("127.0.0.1:1", timeout=0.5) is None
    assert _ctl("local", "down", "--dir", cluster_dir).returncode == 0
