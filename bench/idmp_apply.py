"""IDMP's per-entry cost on a follower, in one process (bench/README.md, "Session 12: IDMP
per-entry cost"): StateMachine.apply (decode + apply + results) of encoded XADD_BATCH
records of 100 entries, thread CPU time, the sides run alternately, the best of `--reps`.

    python bench/idmp_apply.py [--batches 300] [--reps 7]

Also the leader's share, per side: an XAddRequest as the SDK
sends it parsed, turned into the batch (grpc_convert.xadd_batch: build + encode), the
record encoded (8 requests a record), applied with its decoded Record (the leader does not
decode its own), and the XAddResponse built and serialized (grpc_service.XAdd's loop).

Sides, each on a fresh StateMachine:
  plain          no IDMP
  seq            IDMP, the ids as first + count (XAddRequest.idempotent_id_first) throughout
  per-entry-then-seq  IDMP: the first 8 batches with one id per entry, the rest as first +
                 count: what a new SDK client sends (8 batches in flight before a server
                 answered idempotent_id_first_ok; bench/cluster.py sdk_batch)
  per-entry      IDMP, one id per entry throughout (the SDK pinned to the older form)
"""
import argparse
import time

from xraft.node.fsm.entry import Record
from xraft.node.fsm.resolve import resolve_xadd_batch
from xraft.node.server import grpc_convert as cv
from xraft.proto.v1 import client_pb2 as pb

from xraft.node.fsm.entry import Request, XAddBatch, encode_record
from xraft.node.fsm.state_machine import StateMachine

FIELDS = (b"sensor-id", b"1234", b"temperature", b"19.8")
BATCH = 100
CLIENT = 7             # a registered session, as the SDK's requests carry
IN_FLIGHT = 8          # bench/cluster.py BATCH_CONCURRENCY


def records(side: str, batches: int) -> list:
    out = [encode_record(1_699_999_999_999, [Request.register(CLIENT)])]
    for b in range(batches):
        first = 1 + b * BATCH
        entries = [(0, 0, 0, FIELDS)] * BATCH
        if side == "plain":
            batch = XAddBatch.build(b"s", entries)
        elif side == "per-entry" or (side == "per-entry-then-seq" and b < IN_FLIGHT):
            batch = XAddBatch.build(b"s", entries, idmp_pid=b"p1",
                                    idmp_iids=[b"%x" % (first + i) for i in range(BATCH)])
        else:
            batch = XAddBatch.build(b"s", entries, idmp_pid=b"p1", idmp_first=first)
        out.append(encode_record(1_700_000_000_000 + b, [Request.xadd_batch(CLIENT, b + 1, batch)]))
    return out


def requests(side: str, batches: int) -> list:
    """The serialized XAddRequests of `batches` SDK batches (client/commands.py xadd_batch)."""
    out = []
    for b in range(batches):
        per_entry = side == "per-entry" or (side == "per-entry-then-seq" and b < IN_FLIGHT)
        req = pb.XAddRequest(key=b"s")
        for i in range(BATCH):
            e = req.entries.add(idempotent_id=b"%x" % (1 + b * BATCH + i)) if per_entry else req.entries.add()
            for k in range(0, len(FIELDS), 2):
                e.fields.add(name=FIELDS[k], value=FIELDS[k + 1])
        if side != "plain":
            req.producer_id = b"p1"
        if side != "plain" and not per_entry:
            req.idempotent_id_first = 1 + b * BATCH
        out.append(req.SerializeToString())
    return out


def leader(blobs: list) -> None:
    """The leader's per-request work on `blobs` (module doc), on a fresh StateMachine."""
    sm = StateMachine()
    sm.apply(1, encode_record(1_699_999_999_999, [Request.register(CLIENT)]))
    index = 1
    for r in range(0, len(blobs), IN_FLIGHT):
        reqs = []
        for k, blob in enumerate(blobs[r:r + IN_FLIGHT]):
            msg = pb.XAddRequest()
            msg.ParseFromString(blob)
            batch, _ = cv.xadd_batch(msg)
            reqs.append(resolve_xadd_batch(CLIENT, r + k + 1, batch))
        now_ms = 1_700_000_000_000 + r
        data = encode_record(now_ms, reqs)
        index += 1
        for results in sm.apply(index, data, record=Record(now_ms, tuple(reqs))):
            out = pb.XAddResponse(idempotent_id_first_ok=True)
            add = out.results.add
            for res in results:
                ms, _, seq = res.partition(b"-")
                sid = add().id
                sid.ms = int(ms)
                sid.seq = int(seq)
            out.SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    sides = ("plain", "seq", "per-entry-then-seq", "per-entry")
    recs = {side: records(side, args.batches) for side in sides}
    best = {side: float("inf") for side in sides}
    for _ in range(args.reps):
        for side in sides:
            sm = StateMachine()
            t = time.thread_time()
            for i, data in enumerate(recs[side], 1):
                got = sm.apply(i, data, want_results=False)
            assert len(got[0]) == BATCH and all(type(r) is bytes for r in got[0]), got[0][:2]
            best[side] = min(best[side], time.thread_time() - t)
    n = args.batches * BATCH
    print(f"{n} entries per side; best of {args.reps}")
    print("follower: StateMachine.apply of the records")
    for side in sides:
        print(f"  {side:20s} {1e6 * best[side] / n:6.3f} us/entry  bytes/entry "
              f"{sum(map(len, recs[side])) / n:5.1f}")
    lsides = sides
    blobs = {side: requests(side, args.batches) for side in lsides}
    lbest = {side: float("inf") for side in lsides}
    for _ in range(args.reps):
        for side in lsides:
            t = time.thread_time()
            leader(blobs[side])
            lbest[side] = min(lbest[side], time.thread_time() - t)
    print("leader: parse, convert, encode, apply, reply")
    for side in lsides:
        print(f"  {side:20s} {1e6 * lbest[side] / n:6.3f} us/entry")


if __name__ == "__main__":
    main()
