"""`xraftctl slots move`: move a slot range to another data group, through the metadata group.

    xraftctl slots move --seed S --slots 100-199 --to-group G [--json] [--wait 300]

1. Reads the map (GetSlotMap) and proposes BeginMove(expect_epoch = its epoch) to the
   metadata group's leader (ProposeMapChange). A stale epoch (someone changed the map in
   between) is planned again from the new map, a few times; a transient error (unknown
   outcome, unavailable, deadline) reads the map again until --wait. If the map already holds this
   very move (a CLI that crashed and was run again), it is watched, not begun again; if G
   already owns every slot of the run, there is nothing to do (exit 0).
2. Watches the map (every POLL_S; a map older than one already seen is ignored) with a
   progress bar over the phases, until the migration leaves the map: the reconciler on the metadata leader drives it (node/server/
   move_reconciler.py); the CLI only watches, so killing it changes nothing.
3. Exit 0 only if the slots' owner is then G; 1 if the move was aborted (the reason is
   printed) or did not end within --wait.

--json prints {"first", "last", "from_group", "to_group", "result": "moved" | "aborted" |
"timeout", "reason", "owner", "epoch", "move_s", "write_wait_ms", "phases": [{"phase",
"epoch", "at_s"}]}. write_wait_ms is how long writes to those slots could not be served, as
the CLI saw it in the map: from the epoch that froze them (SEALING: after the pre-copy of
PRECOPYING, during which the source serves) to the first map where the target had activated
them (RELEASED, or the move gone); within the poll interval.

This module talks to nodes only through the SDK; it writes the change's documented JSON
(docs/sharding.md) itself (ops/ never imports node/).
"""
from __future__ import annotations

import io
import json
import sys
import time

import click

from xraft.client import errors

from .cluster_admin import _ask
from .cluster_status import Connection, StatusError
from .members_cli import _transient

POLL_S = 0.05
BEGIN_ATTEMPTS = 5
PHASES = ("precopying", "sealing", "copying", "verified", "decided", "released")
FROZEN_PHASES = ("sealing", "copying", "verified")     # routing parks the slots' requests


def parse_slots(text: str) -> tuple:
    first, sep, last = text.partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise StatusError(f"--slots {text!r}: expected FIRST-LAST, e.g. 100-199") from None
    if not 0 <= a <= b <= 16383:
        raise StatusError(f"--slots {text!r}: slots are 0-16383 and FIRST <= LAST")
    return a, b


def owner_of(slot_map: dict, slot: int) -> int:
    return next(g for a, b, g in slot_map["slots"] if a <= slot <= b)


def migration(slot_map: dict, first: int, last: int):
    return next((m for m in slot_map.get("migrations", ()) if m["first"] == first and m["last"] == last), None)


def read_map(client, conn: Connection) -> dict:
    return json.loads(client.get_slot_map(timeout=conn.timeout).slot_map)


def begin(client, conn: Connection, first: int, last: int, to_group: int, wait_s: float = 60.0) -> dict:
    """Propose the BeginMove (or find it already there); the map holding the migration.
    A transient error (unknown outcome, unavailable, deadline: a metadata leader changing)
    reads the map again until wait_s: the move is either in it now or was never begun."""
    deadline = time.monotonic() + wait_s
    stale = 0
    while True:
        try:
            m = read_map(client, conn)
            mig = migration(m, first, last)
            if mig is not None:
                if mig["target"] != to_group:
                    raise StatusError(f"slots {first}-{last} are already moving to group {mig['target']}")
                return m
            if all(g == to_group for a, b, g in m["slots"] if a <= last and b >= first):
                return m                        # already there (a re-run after the move finished)
            change = json.dumps({"v": 1, "kind": "begin_move", "expect_epoch": m["epoch"], "first": first,
                                 "last": last, "target": to_group}, sort_keys=True, separators=(",", ":"))
            r = client.propose_map_change(change.encode(), timeout=conn.timeout)
        except errors.XRaftError as e:
            if not _transient(e) or time.monotonic() > deadline:
                raise
            time.sleep(POLL_S * 4)
            continue
        if r.applied:
            return json.loads(r.slot_map)
        if r.refused_kind != "stale_epoch":
            raise StatusError(f"the metadata group refused the move: {r.refused}")
        stale += 1
        if stale >= BEGIN_ATTEMPTS:
            raise StatusError(f"the slot map kept changing: {BEGIN_ATTEMPTS} attempts to begin the move were stale")


def watch(client, conn: Connection, first: int, last: int, to_group: int, wait_s: float,
          show_progress: bool) -> dict:
    t0 = time.monotonic()
    m = begin(client, conn, first, last, to_group, wait_s)
    mig = migration(m, first, last)
    source = mig["source"] if mig else owner_of(m, first)
    phases, reason, frozen_at, live_at = [], "", None, None
    # The bar goes to stderr (results to stdout); with --json it is not shown at all.
    bar = click.progressbar(length=len(PHASES), label=f"slots {first}-{last} -> group {to_group}",
                            file=sys.stderr if show_progress else io.StringIO())
    with bar:
        while True:
            now = time.monotonic() - t0
            phase = mig["phase"] if mig else "finished"
            if not phases or phases[-1]["phase"] != phase:
                phases.append({"phase": phase, "epoch": m["epoch"], "at_s": round(now, 3)})
                if phase in PHASES:
                    bar.update(PHASES.index(phase) + 1 - bar.pos)
                    bar.label = f"slots {first}-{last} -> group {to_group}: {phase}"
            if mig is not None and frozen_at is None and phase in FROZEN_PHASES:
                frozen_at = now
            if live_at is None and (phase in ("released", "finished") or phase == "aborted"):
                live_at = now
            if mig is not None and mig.get("reason"):
                reason = mig["reason"]
            if mig is None:
                break
            if now > wait_s:
                break
            time.sleep(POLL_S)
            try:
                newer = read_map(client, conn)
            except errors.XRaftError:
                continue                    # a node restarting: ask again
            if newer["epoch"] < m["epoch"]:
                # A node that just restarted may serve an older map for a moment (a commit
                # index saved without fsync is re-learned from the leader): never go back.
                continue
            m = newer
            mig = migration(m, first, last)
    owner = owner_of(m, first)
    result = "moved" if mig is None and owner == to_group else "timeout" if mig is not None else "aborted"
    wait_ms = round(1000 * ((live_at if live_at is not None else time.monotonic() - t0) - (frozen_at or 0)))
    return {"first": first, "last": last, "from_group": source, "to_group": to_group, "result": result,
            "reason": reason, "owner": owner, "epoch": m["epoch"], "move_s": round(time.monotonic() - t0, 3),
            "write_wait_ms": wait_ms if frozen_at is not None else 0, "phases": phases}


def move(conn: Connection, slots: str, to_group: int, wait_s: float, show_progress: bool) -> dict:
    first, last = parse_slots(slots)
    return _ask(conn, "slot move", lambda c: watch(c, conn, first, last, to_group, wait_s, show_progress))


def move_text(r: dict) -> str:
    head = f"slots {r['first']}-{r['last']}: group {r['from_group']} -> group {r['to_group']}"
    if r["result"] == "moved":
        return (f"{head}: moved in {r['move_s']:.2f}s (writes waited about {r['write_wait_ms']} ms); "
                f"map epoch {r['epoch']}")
    if r["result"] == "aborted":
        return f"{head}: ABORTED ({r['reason'] or 'no reason given'}); the slots stay with group {r['owner']}"
    return f"{head}: not finished after {r['move_s']:.0f}s (phase {r['phases'][-1]['phase']}); it goes on"


def migrations_of(conn: Connection) -> list:
    """The map's moves in progress, for `xraftctl status` ([] from a node without GetSlotMap)."""
    try:
        return _ask(conn, "slot map", lambda c: read_map(c, conn)).get("migrations", [])
    except StatusError:
        return []


def migrations_text(moves: list) -> str:
    if not moves:
        return "\nno slot moves in progress"
    lines = ["", f"{'SLOTS':13}  {'FROM':>4}  {'TO':>4}  {'PHASE':9}  {'CHUNKS':>6}  REASON"]
    for m in moves:
        lines.append(f"{m['first']}-{m['last']:<8}  {m['source']:>4}  {m['target']:>4}  {m['phase']:9}  "
                     f"{m['replicated']:>6}  {m['reason'] or '-'}")
    return "\n".join(lines)


def register(main, seed_options, run) -> None:
    @main.group()
    def slots():
        """Slots: move a slot range between data groups."""

    @slots.command("move")
    @seed_options
    @click.option("--slots", "slot_range", required=True, metavar="FIRST-LAST", help="The slots, e.g. 100-199.")
    @click.option("--to-group", required=True, type=click.IntRange(1), help="The data group to own them.")
    @click.option("--wait", "wait_s", default=300.0, show_default=True, type=click.FloatRange(1, 86400),
                  help="Seconds to watch the move before giving up watching (the move goes on).")
    @click.option("--json", "as_json", is_flag=True,
                  help='Print {"first", "last", "from_group", "to_group", "result", "reason", "owner", "epoch", '
                       '"move_s", "write_wait_ms", "phases"}.')
    def slots_move(conn, slot_range, to_group, wait_s, as_json):
        """Move slots FIRST-LAST to group G online and wait until the move ends.

        Begins the move in the metadata group (compare-and-set on the map's epoch), then
        watches the map while the metadata leader drives it (seal, copy, verify, decide,
        release). Exit 0 only when group G owns the slots; 1 if the move was aborted (a
        timeout before the decision, an operator) or is still running after --wait.
        Killing this command does not stop the move; running it again watches it."""
        r = run(move, conn, slot_range, to_group, wait_s, not as_json)
        click.echo(json.dumps(r) if as_json else move_text(r))
        if r["result"] != "moved":
            raise SystemExit(1)
