"""Runs a bench script as a subprocess for a smoke test, and leaves no node behind."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from xraft.ops import local_cluster as lc

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, args: list, work: Path, cluster_dirs: tuple, limit_s: float) -> tuple:
    """(exit code, output) of `bench/<script> <args> --dir <work>`. On a hang (limit_s: a guard
    only) SIGTERM lets the bench stop its nodes, then AssertionError. Whatever happens, any node
    still alive in work/<d> for d in cluster_dirs gets SIGKILL: nodes run in their own sessions."""
    proc = subprocess.Popen([sys.executable, str(BENCH_DIR / script), *args, "--dir", str(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=30)
        raise AssertionError(f"bench/{script} still running after {limit_s} s:\n{text}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for name in cluster_dirs:
            if lc.cluster_file(work / name).exists():
                cluster = lc.load(str(work / name))
                for node in cluster.nodes:
                    if lc.is_alive(cluster, node):
                        os.kill(node.pid, signal.SIGKILL)
    return proc.returncode, text
