"""The linearizability checker on long register histories (issue 11): the plain search (the
checker before issue 11: one Wing & Gong search over a key's whole history) beside the
checker with its reductions and segments (ops/linearizability.py).

    python bench/linearizability.py [HISTORY.jsonl ...] [--seed N] [--json FILE]

Checks the synthetic soak-shaped key of tests/ops/lin_histories.py (3,000 ops, 3 outages
of 40 info ops; seed --seed) and the register keys of each nemesis history given (a run's
nemesis-<seed>/history.jsonl). Per key: ops, info writes, and for each checker its answer
(True, False, or "undecided" over the 2,000,000-step budget), steps and seconds; and the
answers of each lever alone (reductions without segments, segments without reductions).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xraft.ops import linearizability as lin  # noqa: E402
from xraft.ops import nemesis_check as nc  # noqa: E402
from tests.ops.lin_histories import simulate, soak_steps  # noqa: E402

BUDGET = 2_000_000


def measure(ops: list, **how) -> dict:
    t0 = time.perf_counter()
    try:
        verdict = lin.check_partition(ops, max_steps=BUDGET, **how)
        answer, steps, searched, segments = verdict.linearizable, verdict.steps, verdict.searched, verdict.segments
    except lin.CheckBudgetExceeded:
        answer, steps, searched, segments = "undecided", BUDGET + 1, None, None
    return {"answer": answer, "steps": steps, "searched": searched, "segments": segments,
            "seconds": round(time.perf_counter() - t0, 3)}


def key_row(name: str, ops: list) -> dict:
    return {"history": name, "key": str(ops[0].key), "ops": len(ops),
            "info_writes": sum(op.kind == "put" and op.indeterminate for op in ops),
            "plain": measure(ops, reduce=False, split=False), "checker": measure(ops),
            # each lever alone
            "reductions_only": measure(ops, split=False), "segments_only": measure(ops, reduce=False)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("histories", nargs="*")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = [key_row(f"synthetic soak-shaped (seed {args.seed})", simulate(soak_steps(random.Random(args.seed))))]
    for path in args.histories:
        with open(path) as f:
            history = [json.loads(line) for line in f]
        for part in lin.KV_MODEL.partition(nc.register_ops(nc.pair(history))):
            rows.append(key_row(path, part))
    for r in rows:
        p, c = r["plain"], r["checker"]
        print(f"{r['history']} {r['key']}: {r['ops']} ops, {r['info_writes']} info writes | plain: {p['answer']}, "
              f"{p['steps']} steps, {p['seconds']} s | checker: {c['answer']}, {c['searched']} ops searched in "
              f"{c['segments']} segments, {c['steps']} steps, {c['seconds']} s | reductions only: "
              f"{r['reductions_only']['answer']}, segments only: {r['segments_only']['answer']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
