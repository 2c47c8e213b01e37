"""The demo end to end against real xraft-node processes (about 15 s).

Select it with `-k e2e`. It fails (does not skip) when the node cannot run:
the demo is the README's main job.
"""
import json
import os
import re
import signal
import subprocess
import sys

from xraft.ops import local_cluster as lc


def test_e2e_demo_survives_leader_crash(tmp_path):
    d = tmp_path / "demo"
    try:
        proc = subprocess.run([sys.executable, "-m", "xraft.ops.demo", "--dir", str(d), "--seconds", "2"],
                              capture_output=True, text=True, timeout=240)
    finally:
        # The demo stops its clusters itself; make sure, so a failed run leaves no node behind.
        for dir_ in (d, d / "sharded"):
            if lc.cluster_file(dir_).exists():
                cluster = lc.load(str(dir_))
                for node in cluster.nodes:
                    if lc.is_alive(cluster, node):
                        os.kill(node.pid, signal.SIGKILL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"node \d elected leader in \d+\.\ds", out), out
    assert "== OK" in out
    m = re.search(r"check: all (\d+)/(\d+) acknowledged readings are in the stream, (\d+)/(\d+) processed", out)
    assert m and m.group(1) == m.group(2) == m.group(3) == m.group(4) and int(m.group(1)) > 20, out
    assert re.search(r"c2 crashed holding [1-9]\d*, claimed by c1 with XAUTOCLAIM: [1-9]", out), out
    assert "restarted from disk, caught up to index" in out
    # part 2: a sharded cluster moves the stream's slot under load
    assert re.search(r"slots (\d+)-\1: group \d -> group \d: moved in", out), out
    m = re.search(r"check: (\d+)/(\d+) acknowledged readings in the stream, (\d+)/(\d+) processed, 0 pending", out)
    assert m and m.group(1) == m.group(2) == m.group(3) == m.group(4) and int(m.group(1)) > 20, out
    assert "== OK (part 2)" in out
    sharded = json.loads((d / "sharded" / "cluster.json").read_text())
    assert sharded["state"] == "stopped"
    after = json.loads((d / "cluster.json").read_text())
    assert after["state"] == "stopped" and all(n["pid"] is None for n in after["nodes"])
