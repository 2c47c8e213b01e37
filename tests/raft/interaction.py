"""The interaction environment behind the golden scenario files (testdata/*.txt).

A set of RawNodes over MemoryStorage, driven step by step by the commands of a
scenario file, in the manner of etcd-io/raft's rafttest.InteractionEnv: nothing
happens unless a command makes it happen, so every Ready, every message and
every delivery appears in the output in the order it occurred.

Each node follows the Ready contract literally (rawnode.py): persist snapshot,
entries and hard state (then sync), hand messages to the network, apply the
snapshot and committed entries, advance. The state machine is etcd's
"appender": its image after index i is the concatenation of the payloads of
entries 1..i, which keeps snapshots small, readable and easy to chunk.

Messages sit in one FIFO queue until a command delivers or drops them. `cut`
isolates nodes: messages from or to them are dropped (and printed as dropped)
when delivery is attempted; `heal` discards those still queued (they were lost
in the partition) and reconnects everyone.

Commands (arguments in parentheses are optional):
  add-nodes N (voters=(..) learners=(..) index=I content=S prevote=B checkquorum=B
               read-only=safe|lease max-inflight=N snap-chunk=N max-size-per-msg=N snap-window=N seed=N)
  campaign ID | propose ID DATA | read-index ID CTX | transfer-leadership from=ID to=ID
  propose-conf-change ID (v1=true) (transition=auto|implicit|explicit), then a line
      of changes: vN add voter, lN add learner, rN remove, uN update; empty = leave joint
  process-ready ID.. | deliver-msgs ID.. (type=T) (drop=(ID..)) | stabilize (ID..)
  tick ID N | tick-heartbeat ID | tick-election ID
  tick-all ROUNDS (until=change): every node ticks once per round, in ID order
  raft-log ID | raft-state | status ID | compact ID NEW_FIRST_INDEX
  cut ID.. | heal | report-unreachable ID PEER | log-level none|all
  deliver-msgs also takes count=N (only the first N matching messages) and from=ID
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Optional

from xraft.node.raft.codec import CodecError, decode_conf_change_entry
from xraft.node.raft.config import Config
from xraft.node.raft.rawnode import RawNode
from xraft.node.raft.read_only import ReadOnlyOption
from xraft.node.raft.storage import MemoryStorage
from xraft.node.raft.types import (
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfChangeV2,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType as MT,
    RaftError,
    Ready,
    Snapshot,
    SnapshotMetadata,
)

from .datadriven import DataDrivenError, TestCase

INDENT = "  "

# ------------------------------------------------------------------ formatting

_CC_LETTER = {ConfChangeType.ADD_NODE: "v", ConfChangeType.ADD_LEARNER_NODE: "l",
              ConfChangeType.REMOVE_NODE: "r", ConfChangeType.UPDATE_NODE: "u"}
_CC_TYPE = {v: k for k, v in _CC_LETTER.items()}


def quote(data: bytes) -> str:
    return '"' + data.decode("utf-8", "backslashreplace").replace('"', '\\"') + '"'


def ids(xs) -> str:
    return "(" + " ".join(str(x) for x in sorted(xs)) + ")"


def describe_changes(changes) -> str:
    return " ".join(f"{_CC_LETTER[c.type]}{c.node_id}" for c in changes)


def describe_entry(e: Entry) -> str:
    head = f"{e.term}/{e.index}"
    if e.type == EntryType.NORMAL:
        return f"{head} {quote(e.data)}"
    try:
        cc = decode_conf_change_entry(e)
    except CodecError as exc:
        return f"{head} {e.type.name} <undecodable: {exc}>"
    if isinstance(cc, ConfChange):
        return f"{head} ConfChange {describe_changes(cc.as_v2().changes)}"
    tr = "" if cc.transition == ConfChangeTransition.AUTO else f"[{cc.transition.name.lower()}]"
    body = describe_changes(cc.changes) if cc.changes else "leave-joint"
    return f"{head} ConfChangeV2{tr} {body}"


def describe_conf_state(cs: ConfState) -> str:
    s = f"voters={ids(cs.voters)}"
    if cs.voters_outgoing:
        s += f"&&{ids(cs.voters_outgoing)}"
    if cs.learners:
        s += f" learners={ids(cs.learners)}"
    if cs.learners_next:
        s += f" learners_next={ids(cs.learners_next)}"
    if cs.auto_leave:
        s += " autoleave"
    if cs.removed:
        s += f" removed={ids(cs.removed)}"
    return s


def describe_snapshot(s: Snapshot) -> str:
    md = s.metadata
    return f"{md.term}/{md.index} {describe_conf_state(md.conf_state)} data={quote(s.data)}"


def describe_message(m: Message) -> str:
    s = f"{m.frm}->{m.to} {m.type.name} term={m.term}"
    t = m.type
    if t in (MT.APP, MT.VOTE, MT.PRE_VOTE):
        s += f" log={m.log_term}/{m.index}"
    elif t == MT.APP_RESP:
        s += f" index={m.index}"
        if m.reject:
            s += f" REJECT hint={m.log_term}/{m.reject_hint}"
    elif m.index or m.log_term:
        s += f" index={m.index}" + (f" log_term={m.log_term}" if m.log_term else "")
    if m.commit or t in (MT.APP, MT.HEARTBEAT):
        s += f" commit={m.commit}"
    if m.reject and t != MT.APP_RESP:
        s += " REJECT"
    if m.context:
        s += f" ctx={quote(m.context)}"
    if t == MT.SNAP_STATUS and m.chunk_total:
        s += f" holds=[0,{m.chunk_offset})/{m.chunk_total}"   # a follower's ack or rejection
    if m.snapshot is not None:
        s += (f" snap={describe_snapshot(m.snapshot)}"
              f" chunk=[{m.chunk_offset},{m.chunk_offset + len(m.snapshot.data)})/{m.chunk_total}")
    if m.entries:
        s += " entries=[" + ", ".join(describe_entry(e) for e in m.entries) + "]"
    return s


def describe_ready(rd: Ready) -> list[str]:
    out = [f"Ready must_sync={str(rd.must_sync).lower()}:"]
    if rd.soft_state is not None:
        out.append(f"soft state: lead={rd.soft_state.leader} {rd.soft_state.role.name}")
    if rd.hard_state is not None:
        hs = rd.hard_state
        out.append(f"hard state: term={hs.term} vote={hs.vote} commit={hs.commit}")
    if rd.snapshot is not None:
        out.append(f"snapshot: {describe_snapshot(rd.snapshot)}")
    sections = [("entries (to persist)", [describe_entry(e) for e in rd.entries]),
                ("committed (to apply)", [describe_entry(e) for e in rd.committed_entries]),
                ("send now", [describe_message(m) for m in rd.messages]),
                ("send after persist", [describe_message(m) for m in rd.persisted_messages]),
                ("read states", [f"index={r.index} ctx={quote(r.request_ctx)}" for r in rd.read_states])]
    for title, lines in sections:
        if lines:
            out.append(f"{title}:")
            out.extend(INDENT + ln for ln in lines)
    return out


def parse_changes(text: str) -> list[ConfChangeSingle]:
    out = []
    for tok in text.split():
        kind = _CC_TYPE.get(tok[0])
        if kind is None or not tok[1:].isdigit():
            raise DataDrivenError(f"bad conf change {tok!r} (want vN, lN, rN or uN)")
        out.append(ConfChangeSingle(kind, int(tok[1:])))
    return out


# ------------------------------------------------------------------ the environment


class Node:
    def __init__(self, raw: RawNode, storage: MemoryStorage, config: Config, boot: Snapshot) -> None:
        self.raw = raw
        self.storage = storage
        self.config = config
        self.history: list[Snapshot] = [boot]  # state-machine image after each applied index


class InteractionEnv:
    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.messages: list[Message] = []  # the network: FIFO, delivered only on command
        self.cut: set[int] = set()
        self.out: list[str] = []
        self.depth = 0
        self.verbose = True  # `log-level none` hides everything but errors (for setup steps)
        self.handlers: dict[str, Callable[[TestCase], None]] = {
            "add-nodes": self.cmd_add_nodes, "campaign": self.cmd_campaign,
            "propose": self.cmd_propose, "propose-conf-change": self.cmd_propose_conf_change,
            "read-index": self.cmd_read_index, "transfer-leadership": self.cmd_transfer_leadership,
            "process-ready": self.cmd_process_ready, "deliver-msgs": self.cmd_deliver_msgs,
            "stabilize": self.cmd_stabilize, "tick": self.cmd_tick,
            "tick-heartbeat": self.cmd_tick_heartbeat, "tick-election": self.cmd_tick_election,
            "raft-log": self.cmd_raft_log, "raft-state": self.cmd_raft_state,
            "status": self.cmd_status, "compact": self.cmd_compact, "cut": self.cmd_cut,
            "heal": self.cmd_heal, "log-level": self.cmd_log_level, "tick-all": self.cmd_tick_all, "report-unreachable": self.cmd_report_unreachable,
            "quiesced": self.cmd_quiesced, "wake": self.cmd_wake,
        }

    # ---- plumbing

    def handle(self, case: TestCase) -> str:
        fn = self.handlers.get(case.cmd)
        if fn is None:
            raise DataDrivenError(f"{case.where()}: unknown command {case.cmd!r}")
        self.out, self.depth = [], 0
        try:
            fn(case)
        except RaftError as exc:  # a typed refusal from the core is part of the behaviour shown
            self.say(f"error: {type(exc).__name__}: {exc}", always=True)
        return "\n".join(self.out)

    def say(self, line: str, always: bool = False) -> None:
        if self.verbose or always:
            self.out.append(INDENT * self.depth + line)

    @contextmanager
    def indented(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    @contextmanager
    def observing(self):
        """Print every role/term/leader change that happens inside the block, in ID order."""
        before = {nid: self._role(nid) for nid in self.nodes}
        try:
            yield
        finally:
            for nid in sorted(self.nodes):
                now = self._role(nid)
                if before.get(nid) != now:
                    role, term, lead = now
                    who = "" if role == "LEADER" else (f", leader {lead}" if lead else ", no leader")
                    self.say(f"~ {nid} is {role} at term {term}{who}")

    def _role(self, nid: int) -> tuple[str, int, int]:
        st = self.nodes[nid].raw.status()
        return st.soft_state.role.name, st.hard_state.term, st.soft_state.leader

    def node_ids(self, case: TestCase) -> list[int]:
        got = [int(x) for x in case.positional()]
        for nid in got:
            if nid not in self.nodes:
                raise DataDrivenError(f"{case.where()}: no node {nid}")
        return got

    def one_id(self, case: TestCase) -> int:
        pos = case.positional()
        if not pos or not pos[0].isdigit() or int(pos[0]) not in self.nodes:
            raise DataDrivenError(f"{case.where()}: {case.cmd} needs an existing node ID first")
        return int(pos[0])

    def rest(self, case: TestCase) -> list[str]:
        return case.positional()[1:]

    # ---- node lifecycle

    def cmd_add_nodes(self, case: TestCase) -> None:
        n = int(case.positional()[0])
        voters = tuple(int(x) for x in case.get_list("voters"))
        learners = tuple(int(x) for x in case.get_list("learners"))
        index = case.get_int("index", 0)
        content = (case.get("content") or "").encode()
        if (voters or learners) and index < 1:
            raise DataDrivenError(f"{case.where()}: a bootstrapped node needs index >= 1")
        read_only = {"safe": ReadOnlyOption.SAFE, "lease": ReadOnlyOption.LEASE_BASED}[
            case.get("read-only", "safe")]
        for _ in range(n):
            nid = len(self.nodes) + 1
            storage = MemoryStorage()
            boot = Snapshot()
            if voters or learners:
                # Bootstrap as etcd's tests do: a snapshot at `index`, term 1, holding the config.
                cs = ConfState(voters=voters, learners=learners)
                boot = Snapshot(SnapshotMetadata(index=index, term=1, conf_state=cs), content)
                storage.apply_snapshot(boot)
                storage.sync()
            cfg = Config(id=nid, election_tick=case.get_int("election-tick", 10), heartbeat_tick=1,
                         applied=boot.metadata.index,
                         rng=random.Random(case.get_int("seed", 0) * 1000 + nid),
                         pre_vote=case.get_bool("prevote", True),
                         check_quorum=case.get_bool("checkquorum", True),
                         read_only_option=read_only,
                         max_inflight_msgs=case.get_int("max-inflight", 256),
                         max_size_per_msg=case.get_int("max-size-per-msg", 1 << 20),
                         max_snapshot_chunk_bytes=case.get_int("snap-chunk", 1 << 20),
                         max_snapshot_inflight_bytes=case.get_int("snap-window", 8 << 20),
                         quiesce=case.get_bool("quiesce", False))
            raw = RawNode(cfg, storage)
            self.nodes[nid] = Node(raw, storage, cfg, boot)
            st = raw.status()
            self.say(f"{nid}: {describe_conf_state(st.conf_state)} term={st.hard_state.term} "
                     f"commit={st.hard_state.commit} applied={st.applied} "
                     f"last={storage.last_index()} prevote={str(cfg.pre_vote).lower()} "
                     f"checkquorum={str(cfg.check_quorum).lower()} read-only={case.get('read-only', 'safe')}")

    # ---- inputs

    def cmd_campaign(self, case: TestCase) -> None:
        with self.observing():
            self.nodes[self.one_id(case)].raw.campaign()

    def cmd_propose(self, case: TestCase) -> None:
        with self.observing():
            self.nodes[self.one_id(case)].raw.propose(self.rest(case)[0].encode())

    def cmd_read_index(self, case: TestCase) -> None:
        with self.observing():
            self.nodes[self.one_id(case)].raw.read_index(self.rest(case)[0].encode())

    def cmd_propose_conf_change(self, case: TestCase) -> None:
        nid = self.one_id(case)
        changes = parse_changes(" ".join(case.input))
        if case.get_bool("v1", False):
            if len(changes) != 1 or case.has("transition"):
                raise DataDrivenError(f"{case.where()}: a v1 change has exactly one operation")
            cc = ConfChange(changes[0].type, changes[0].node_id)
        else:
            tr = {"auto": ConfChangeTransition.AUTO, "implicit": ConfChangeTransition.JOINT_IMPLICIT,
                  "explicit": ConfChangeTransition.JOINT_EXPLICIT}[case.get("transition", "auto")]
            cc = ConfChangeV2(transition=tr, changes=tuple(changes))
        with self.observing():
            self.nodes[nid].raw.propose_conf_change(cc)

    def cmd_transfer_leadership(self, case: TestCase) -> None:
        frm, to = case.get_int("from"), case.get_int("to")
        with self.observing():
            self.nodes[frm].raw.transfer_leader(to)

    def cmd_report_unreachable(self, case: TestCase) -> None:
        nid, peer = self.one_id(case), int(self.rest(case)[0])
        with self.observing():
            self.nodes[nid].raw.report_unreachable(peer)

    def _tick(self, nid: int, n: int) -> None:
        with self.observing():
            for _ in range(n):
                self.nodes[nid].raw.tick()

    def cmd_tick(self, case: TestCase) -> None:
        self._tick(self.one_id(case), int(self.rest(case)[0]))

    def cmd_tick_heartbeat(self, case: TestCase) -> None:
        nid = self.one_id(case)
        self._tick(nid, self.nodes[nid].config.heartbeat_tick)

    def cmd_tick_election(self, case: TestCase) -> None:
        nid = self.one_id(case)
        self._tick(nid, self.nodes[nid].config.election_tick)

    def cmd_tick_all(self, case: TestCase) -> None:
        """N rounds in which every node ticks once (in ID order): time passing everywhere.

        With until=change, stop after the first round in which some node changed role, term
        or leader (messages are not delivered while ticking).
        """
        stop = case.get("until") == "change"
        for k in range(1, int(case.positional()[0]) + 1):
            mark = len(self.out)
            with self.observing():
                for nid in sorted(self.nodes):
                    self.nodes[nid].raw.tick()
            if len(self.out) > mark:
                self.out.insert(mark, INDENT * self.depth + f"round {k}:")
                if stop:
                    return

    def cmd_log_level(self, case: TestCase) -> None:
        self.verbose = case.positional()[0] != "none"

    def cmd_cut(self, case: TestCase) -> None:
        self.cut |= set(self.node_ids(case))
        self.say(f"cut off: {ids(self.cut)}")

    def cmd_heal(self, case: TestCase) -> None:
        # Messages still queued across the cut were lost with the partition: healing must
        # not deliver them late (that would be a different scenario: a slow network).
        n = len(self.messages)
        self.messages = [m for m in self.messages if not self.crosses_cut(m)]
        lost = n - len(self.messages)
        self.cut.clear()
        self.say("network healed" + (f"; {lost} messages lost in the partition" if lost else ""))

    def crosses_cut(self, m: Message) -> bool:
        return (m.frm in self.cut or m.to in self.cut) and m.frm != m.to

    # ---- Ready processing and delivery

    def process_ready(self, nid: int) -> None:
        node = self.nodes[nid]
        rd = node.raw.ready()
        for line in describe_ready(rd):
            self.say(line)
        # 1. persist (snapshot, entries, hard state) and make it durable.
        if rd.snapshot is not None:
            node.storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            node.storage.append(rd.entries)
        if rd.hard_state is not None:
            node.storage.set_hard_state(rd.hard_state)
        node.storage.sync()
        # 2. only now may persisted_messages leave; `messages` could have gone earlier.
        self.messages.extend(rd.messages)
        self.messages.extend(rd.persisted_messages)
        with self.observing():
            # 3. apply, 4. advance.
            if rd.snapshot is not None:
                node.history.append(rd.snapshot)
            for e in rd.committed_entries:
                self._apply(node, e)
            node.raw.advance(rd)

    def _apply(self, node: Node, e: Entry) -> None:
        last = node.history[-1]
        cs = last.metadata.conf_state
        update = e.data
        if e.type != EntryType.NORMAL:
            cc = decode_conf_change_entry(e)
            update = cc.context
            try:
                cs = node.raw.apply_conf_change(cc)
                self.say(f"{node.raw.id} applied {describe_entry(e)}: {describe_conf_state(cs)}")
            except RaftError as exc:
                self.say(f"{node.raw.id} rejected {describe_entry(e)}: {exc}")
        md = SnapshotMetadata(index=e.index, term=e.term, conf_state=cs)
        node.history.append(Snapshot(md, last.data + update))

    def cmd_process_ready(self, case: TestCase) -> None:
        targets = self.node_ids(case)
        for nid in targets:
            if len(targets) > 1:
                self.say(f"> {nid} handling Ready")
                with self.indented():
                    self._process_ready_if_any(nid)
            else:
                self._process_ready_if_any(nid)

    def _process_ready_if_any(self, nid: int) -> None:
        if self.nodes[nid].raw.has_ready():
            self.process_ready(nid)
        else:
            self.say("no Ready")

    def deliver(self, to: int, typ: Optional[MT] = None, drop: bool = False,
                count: Optional[int] = None, frm: Optional[int] = None) -> int:
        """Deliver (or drop) the first `count` (default: all) queued messages to `to`, FIFO."""
        picked = [i for i, m in enumerate(self.messages)
                  if m.to == to and (typ is None or m.type == typ)
                  and (frm is None or m.frm == frm)][:count]
        mine = [self.messages[i] for i in picked]
        keep = set(range(len(self.messages))) - set(picked)
        self.messages = [m for i, m in enumerate(self.messages) if i in keep]
        for m in mine:
            if drop or self.crosses_cut(m):
                self.say(f"dropped: {describe_message(m)}")
                continue
            self.say(describe_message(m))
            with self.indented(), self.observing():
                try:
                    self.nodes[to].raw.step(m)
                except RaftError as exc:
                    self.say(f"error: {type(exc).__name__}: {exc}", always=True)
        return len(mine)

    def cmd_deliver_msgs(self, case: TestCase) -> None:
        typ = MT[case.get("type")] if case.has("type") else None
        count, frm = case.get_int("count"), case.get_int("from")
        n = 0
        for nid in self.node_ids(case):
            n += self.deliver(nid, typ, count=count, frm=frm)
        for nid in case.get_list("drop"):
            n += self.deliver(int(nid), typ, drop=True, count=count, frm=frm)
        if n == 0:
            self.say("no messages")

    def cmd_stabilize(self, case: TestCase) -> None:
        targets = self.node_ids(case) or sorted(self.nodes)
        for _ in range(1000):  # a livelock would be a bug; fail loudly rather than hang
            busy = False
            for nid in targets:
                if self.nodes[nid].raw.has_ready():
                    self.say(f"> {nid} handling Ready")
                    with self.indented():
                        self.process_ready(nid)
                    busy = True
            for nid in targets:
                if any(m.to == nid for m in self.messages):
                    self.say(f"> {nid} receiving messages")
                    with self.indented():
                        self.deliver(nid)
                    busy = True
            if not busy:
                return
        raise AssertionError("stabilize did not converge in 1000 rounds")

    # ---- introspection

    def cmd_raft_log(self, case: TestCase) -> None:
        st = self.nodes[self.one_id(case)].storage
        fi, li = st.first_index(), st.last_index()
        if li < fi:
            self.say(f"log is empty: first index={fi}, last index={li}")
            return
        for e in st.entries(fi, li + 1):
            self.say(describe_entry(e))

    def cmd_raft_state(self, case: TestCase) -> None:
        for nid in sorted(self.nodes):
            role, term, lead = self._role(nid)
            cut = " (cut off)" if nid in self.cut else ""
            self.say(f"{nid}: {role} term={term} lead={lead}{cut}")

    def cmd_quiesced(self, case: TestCase) -> None:
        """Which nodes are asleep (node/raft/quiesce.py)."""
        for nid in sorted(self.nodes):
            self.say(f"{nid}: {'quiesced' if self.nodes[nid].raw.quiesced else 'awake'}")

    def cmd_wake(self, case: TestCase) -> None:
        """`wake 2 [lease-expired]`: what the application does when the leader's node goes silent."""
        with self.observing():
            self.nodes[self.one_id(case)].raw.wake(lease_expired="lease-expired" in self.rest(case))

    def cmd_status(self, case: TestCase) -> None:
        st = self.nodes[self.one_id(case)].raw.status()
        hs = st.hard_state
        line = (f"{st.id}: {st.soft_state.role.name} term={hs.term} vote={hs.vote} commit={hs.commit} "
                f"applied={st.applied} lead={st.soft_state.leader}")
        if st.lead_transferee:
            line += f" transferring to {st.lead_transferee}"
        self.say(line)
        self.say(f"config: {describe_conf_state(st.conf_state)}")
        for pid in sorted(st.progress):
            pr = st.progress[pid]
            flags = ("" if pr.recent_active else " inactive") + (" learner" if pr.is_learner else "")
            self.say(f"{INDENT}{pid}: {pr.state.name} match={pr.match} next={pr.next} "
                     f"inflight={pr.inflight}{flags}")

    def cmd_compact(self, case: TestCase) -> None:
        """Snapshot the state machine at NEW_FIRST_INDEX-1 and drop the log up to it."""
        nid = self.one_id(case)
        node = self.nodes[nid]
        upto = int(self.rest(case)[0]) - 1
        img = next((s for s in node.history if s.metadata.index == upto), None)
        if img is None:
            raise DataDrivenError(f"{case.where()}: node {nid} has not applied index {upto}")
        node.storage.create_snapshot(upto, img.metadata.conf_state, img.data)
        node.storage.compact(upto)
        node.storage.sync()
        self.cmd_raft_log(replace(case, args=case.args[:1]))

