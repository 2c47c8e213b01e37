"""Compiled kernels (issue 14) vs their pure-Python twins, in the same run.

    python bench/kernels.py [--quick] [--json FILE]

Rates are per CPU-second of this process (time.process_time), not wall clock: on a shared
machine a wall-clock figure mostly measures the other processes. Compiled and pure are timed
alternately, best of 7 each.

Per kernel (setup.py KERNELS; each called directly):

  lp_encode           one listpack entry per call, the bench's fields
                      (b"sensor-id", b"1234", b"temperature", b"19.8")
  lp_append_entries   one stream entry (the values of 2 pairs) appended to a listpack
  encode_xentries     the entries of one XADD_BATCH of 100 such entries encoded
                      (XAddBatch.build: the leader, for every SDK batch)
  decode_xadd_batch   one XADD_BATCH of 100 such entries decoded (what every replica
                      does to every record)

and the path they sit on, whole: `apply` of records of one 100-entry XADD batch into
a StateMachine (decode, checks, Stream.append, results), run in a child process
with XRAFT_PURE=1 and in one without (the pure modules import-bind the kernels, so
one process cannot run both).
"""
import argparse
import json
import os
import subprocess
import sys
import time

FIELDS = (b"sensor-id", b"1234", b"temperature", b"19.8")
BATCH = 100


def best_pair(fn_a, fn_b, reps: int) -> tuple:
    """Calls per CPU-second of fn_a and of fn_b: the best of 7 timings of `reps` calls
    each, the two timed alternately so that both see the same machine."""
    times_a, times_b = [], []
    for _ in range(7):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            t = time.process_time()
            for _ in range(reps):
                fn()
            times.append(time.process_time() - t)
    return reps / min(times_a), reps / min(times_b)


def kernels(quick: bool) -> dict:
    import importlib
    from xraft.node.engine import listpack as L
    from xraft.node.fsm import entry as E

    lpc = importlib.import_module("xraft.node.engine._listpack_c")
    entc = importlib.import_module("xraft.node.fsm._entry_c")
    reps = 20_000 if quick else 200_000
    out = {}

    def pair(name, c_fn, py_fn, n):
        c, py = best_pair(c_fn, py_fn, n)
        out[name] = {"compiled_per_s": c, "pure_per_s": py, "speedup": c / py}

    enc_c, enc_py = lpc.lp_encode, L.PURE_KERNELS["lp_encode"]
    pair("lp_encode", lambda: [enc_c(f) for f in FIELDS], lambda: [enc_py(f) for f in FIELDS], reps // 4)
    out["lp_encode"]["compiled_per_s"] *= 4        # per element, not per list of 4
    out["lp_encode"]["pure_per_s"] *= 4

    app_c, app_py = lpc.lp_append_entries, L.PURE_KERNELS["lp_append_entries"]
    head = L.lp_encode(2) + L.lp_encode(0) + L.lp_encode(1)
    tail = L.lp_encode(5)
    bufs = {}

    def appender(fn, key):
        def go():
            lp = bufs.get(key)
            if lp is None or len(lp) > 4000:           # a stream node's size
                lp = bufs[key] = L.lp_new()
            fn(lp, head, FIELDS, 1, 2, tail, 6)
        return go
    pair("lp_append_entries", appender(app_c, "c"), appender(app_py, "py"), reps)

    batch = E.XAddBatch.build(b"bench", [(0, 0, 0, FIELDS)] * BATCH)
    data = batch.raw
    entries = [(0, 0, 0, FIELDS)] * BATCH
    pair("encode_xentries", lambda: entc.encode_xentries(entries, None),
         lambda: E.PURE_KERNELS["_encode_xentries"](entries, None), reps // 100)
    dec_c, dec_py = entc.decode_xadd_batch, E.PURE_KERNELS["_decode_xadd_batch"]
    pair("decode_xadd_batch", lambda: dec_c(data, 0, len(data), BATCH),
         lambda: dec_py(data, 0, len(data), BATCH), reps // 100)
    return out


def apply_path(quick: bool) -> float:
    """Entries/s through StateMachine.apply of 100-entry XADD batch records (this process's mode)."""
    from xraft.node.fsm.entry import Request, XAddBatch, encode_record
    from xraft.node.fsm.state_machine import StateMachine

    records = [encode_record(1_700_000_000_000 + i, [Request.xadd_batch(0, 0, XAddBatch.build(
        b"bench", [(0, 0, 0, FIELDS)] * BATCH))]) for i in range(20 if quick else 200)]
    rates = []
    for _ in range(3):
        sm = StateMachine()
        t = time.process_time()
        for i, data in enumerate(records, 1):
            sm.apply(i, data)
        rates.append(len(records) * BATCH / (time.process_time() - t))
    return max(rates)


def apply_both(quick: bool) -> dict:
    """Each mode's best of 3 child processes, run alternately."""
    out = {}
    for _ in range(3):
        for mode, pure in (("compiled", "0"), ("pure", "1")):
            env = dict(os.environ, XRAFT_PURE=pure)
            argv = [sys.executable, __file__, "--apply-only"] + (["--quick"] if quick else [])
            res = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            if mode not in out or got["entries_per_s"] > out[mode]["entries_per_s"]:
                out[mode] = got
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--apply-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.apply_only:
        from xraft.node import accel
        rate = apply_path(args.quick)
        print(json.dumps({"entries_per_s": rate, "mode": accel.mode()}))
        return 0
    out = {"kernels": kernels(args.quick)}
    for name, r in out["kernels"].items():
        print(f"{name:20s} compiled {r['compiled_per_s']:>12,.0f}/CPU-s   pure {r['pure_per_s']:>12,.0f}/CPU-s   "
              f"{r['speedup']:.2f}x")
    out["apply"] = apply_both(args.quick)
    a = out["apply"]
    out["apply_speedup"] = a["compiled"]["entries_per_s"] / a["pure"]["entries_per_s"]
    print(f"{'apply XADD_BATCH':20s} compiled {a['compiled']['entries_per_s']:>12,.0f} entries/CPU-s "
          f"({a['compiled']['mode']})   pure {a['pure']['entries_per_s']:>12,.0f} entries/CPU-s "
          f"({a['pure']['mode']})   {out['apply_speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
