"""A short scripted tour of the xraft engine (no Raft, no network): `./dev demo`.

    python -m xraft.node.runtime.engine_demo          the scripted demo, exits 0
    python -m xraft.node.runtime.engine_demo --repl   type engine commands, see replies

The script: a producer XADDs sensor readings, a consumer group with two
consumers reads and acknowledges, one consumer "dies" with entries pending,
XAUTOCLAIM hands them to the survivor, XINFO shows the state, and the keyspace
is dumped and loaded back: the copy answers every read exactly as the original.
Time comes from the wall clock here (runtime/ may read it); the engine itself
only ever sees the `now_ms` we pass in.
"""
import argparse
import shlex
import sys
import time

from ..engine import replies
from ..engine.commands import execute
from ..engine.dump import dump_keyspace, load_keyspace
from ..engine.errors import EngineError
from ..engine.keyspace import Keyspace

MAX_REPL_LINE = 64 * 1024


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def render(reply) -> str:
    """A reply in redis-cli's style (RESP2 shape: maps shown as flat pairs)."""
    if isinstance(reply, EngineError):
        return f"(error) {reply.message}"
    if isinstance(reply, replies.WouldBlock):
        return f"(would block on {', '.join(k.decode('utf-8', 'replace') for k in reply.keys)})"
    if reply is None or reply is replies.NULL_ARRAY:
        return "(nil)"
    if isinstance(reply, replies.Status):
        return str(reply)
    if isinstance(reply, int):
        return f"(integer) {reply}"
    if isinstance(reply, bytes):
        return '"' + reply.decode("utf-8", "backslashreplace") + '"'
    items = replies.to_resp2_value(reply)
    if not items:
        return "(empty array)"
    width = len(str(len(items)))
    lines = []
    for n, item in enumerate(items, 1):
        prefix = f"{n})".rjust(width + 1) + " "
        sub = render(item).split("\n")
        lines.append(prefix + sub[0])
        lines += [" " * len(prefix) + rest for rest in sub[1:]]
    return "\n".join(lines)


def run(db: Keyspace, *argv, quiet: bool = False, at_ms: int = None):
    """Run one command, print it and its reply, return the reply (errors as values)."""
    args = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
    try:
        reply = execute(db, args, now_ms() if at_ms is None else at_ms)
    except EngineError as e:
        reply = e
    if not quiet:
        print("> " + " ".join(shlex.quote(a.decode("utf-8", "replace")) for a in args))
        print(render(reply))
    return reply


def section(title: str) -> None:
    print()
    print(f"== {title} " + "=" * max(0, 66 - len(title)))


def demo() -> int:
    db = Keyspace()
    section("A producer appends sensor readings")
    for i, (sensor, celsius) in enumerate([("kitchen", 21.5), ("garage", 9.0), ("attic", 27.25),
                                           ("kitchen", 21.75), ("garage", 8.5), ("attic", 28.0)]):
        run(db, "XADD", "sensors", "*", "sensor", sensor, "celsius", celsius, "seq", i, quiet=i > 1)
    run(db, "XLEN", "sensors")
    run(db, "XRANGE", "sensors", "-", "+", "COUNT", "2")

    section("A consumer group with two consumers")
    run(db, "XGROUP", "CREATE", "sensors", "alerts", "0")
    run(db, "XREADGROUP", "GROUP", "alerts", "alice", "COUNT", "2", "STREAMS", "sensors", ">")
    bob = run(db, "XREADGROUP", "GROUP", "alerts", "bob", "COUNT", "3", "STREAMS", "sensors", ">")
    alice_ids = [entry[0] for entry in replies.to_resp2_value(
        execute(db, [b"XPENDING", b"sensors", b"alerts", b"-", b"+", b"10", b"alice"], now_ms()))]
    run(db, "XACK", "sensors", "alerts", *alice_ids)
    print("alice processed and acknowledged her entries; bob crashes holding his.")
    bob_ids = [entry[0] for entry in replies.to_resp2_value(bob)[0][1]]
    run(db, "XPENDING", "sensors", "alerts")

    section("Bob is gone: alice claims his idle entries")
    later = now_ms() + 60_000        # a minute later, as far as the engine can tell
    claimed = run(db, "XAUTOCLAIM", "sensors", "alerts", "alice", "30000", "0", "COUNT", "10", at_ms=later)
    got = [entry[0] for entry in replies.to_resp2_value(claimed)[1]]
    if sorted(got) != sorted(bob_ids):
        print("unexpected: XAUTOCLAIM did not hand over bob's entries", file=sys.stderr)
        return 1
    run(db, "XACK", "sensors", "alerts", *got)
    run(db, "XREADGROUP", "GROUP", "alerts", "alice", "STREAMS", "sensors", ">")
    run(db, "XINFO", "GROUPS", "sensors", at_ms=later)
    run(db, "XINFO", "CONSUMERS", "sensors", "alerts", at_ms=later)
    run(db, "XINFO", "STREAM", "sensors", at_ms=later)

    section("Lists and strings live in the same keyspace")
    run(db, "RPUSH", "jobs", "resize", "thumbnail", "upload")
    run(db, "LMOVE", "jobs", "jobs:done", "LEFT", "RIGHT")
    run(db, "SET", "site", "lab-3")
    run(db, "SCAN", "0", "COUNT", "100")

    section("Snapshot: dump the keyspace and load it back")
    blob = dump_keyspace(db)
    copy = load_keyspace(blob)
    print(f"dump: {len(blob)} bytes, {len(db.data)} keys")
    probes = [["XRANGE", "sensors", "-", "+"], ["XINFO", "GROUPS", "sensors"], ["XPENDING", "sensors", "alerts"],
              ["LRANGE", "jobs", "0", "-1"], ["LRANGE", "jobs:done", "0", "-1"], ["GET", "site"], ["KEYS", "*"]]
    for probe in probes:
        a = run(db, *probe, quiet=True, at_ms=later)
        b = run(copy, *probe, quiet=True, at_ms=later)
        if a != b:
            print(f"MISMATCH after load for {probe}: {a!r} != {b!r}", file=sys.stderr)
            return 1
    if dump_keyspace(copy) != blob:
        print("MISMATCH: the loaded copy dumps to different bytes", file=sys.stderr)
        return 1
    print(f"the loaded copy gives identical replies to {len(probes)} reads and dumps to the same bytes")
    return 0


def repl() -> int:
    db = Keyspace()
    print("xraft engine REPL: commands like `XADD s * a 1`, `LPUSH l x`; empty line or Ctrl-D quits.")
    while True:
        try:
            line = input("xraft> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        if len(line) > MAX_REPL_LINE:
            print("(error) line too long")
            continue
        try:
            words = shlex.split(line)
        except ValueError as e:
            print(f"(error) {e}")
            continue
        print(render(run(db, *[w.encode() for w in words], quiet=True)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repl", action="store_true", help="interactive prompt running engine commands")
    args = parser.parse_args(argv)
    return repl() if args.repl else demo()


if __name__ == "__main__":
    sys.exit(main())
