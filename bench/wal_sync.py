"""WAL append+sync cost: per-sync latency (fsync=always) and CPU per sync (fsync=never).

    .venv/bin/python bench/wal_sync.py [seconds-per-case]

Prints p50/p99 of one append()+sync() with N records of 300 bytes, for N in
1, 10, 100. Figures only; nothing asserts on them.
"""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from xraft.node.runtime.wal import FsyncPolicy, RecordType, Wal, WalOptions  # noqa: E402


def run(policy: FsyncPolicy, batch: int, seconds: float) -> tuple[float, float, float, int]:
    d = tempfile.mkdtemp(prefix="walsync-", dir=os.environ.get("XRAFT_TEST_DIR"))
    try:
        wal = Wal.open(d, WalOptions(fsync=policy))
        records = [(RecordType.ENTRIES, os.urandom(300))] * batch
        lat = []
        c0 = time.process_time()
        end = time.perf_counter() + seconds
        while True:
            t = time.perf_counter()
            wal.append(records)
            wal.sync()
            now = time.perf_counter()
            lat.append(now - t)
            if now >= end:
                break
        cpu = time.process_time() - c0
        wal.close()
        lat.sort()
        return lat[len(lat) // 2] * 1e6, lat[len(lat) * 99 // 100] * 1e6, cpu / len(lat) * 1e6, len(lat)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    for policy in (FsyncPolicy.ALWAYS, FsyncPolicy.NEVER):
        for batch in (1, 10, 100):
            p50, p99, cpu, n = run(policy, batch, seconds)
            print(f"fsync={policy.value:6} records/sync={batch:3}  p50 {p50:8.1f} us  "
                  f"p99 {p99:8.1f} us  cpu/sync {cpu:7.1f} us  ({n} syncs)", flush=True)


if __name__ == "__main__":
    main()
