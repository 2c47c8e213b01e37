"""Quiesced groups in the runtime: MultiRaft stops ticking them, NodeLiveness watches the
leaders' nodes (node/runtime/liveness.py), and a dead leader's groups still fail over."""
import asyncio
import random
import time

import pytest

from xraft.node.raft.config import Config
from xraft.node.raft.quorum import JointConfig
from xraft.node.raft.types import Message, MessageType as MT, StateRole
from xraft.node.runtime.liveness import (
    LIVENESS_GROUP_ID, MAX_PAIRS_PER_MESSAGE, NodeLiveness, decode_leads, encode_leads)
from tests.runtime.test_driver import Cluster
from tests.runtime.test_multiraft import run, wait_all_leaders  # noqa: F401 (run: the fixture)

GROUPS = tuple(range(1, 31))


def all_quiesced(c, gids):
    return all(c.g(n, gid).rn.quiesced for n in c.nodes for gid in gids)


def all_delivered(c):
    """No message in flight between the nodes."""
    return c.net.in_flight() == 0


def test_idle_groups_quiesce_send_only_node_liveness_and_wake_for_writes(tmp_path, run):
    async def main():
        c = Cluster(tmp_path, groups=GROUPS, tick=0.02, quiesce=True)
        await c.start()
        try:
            leaders = await wait_all_leaders(c, GROUPS)
            # Quiesced, and every message sent delivered: a follower is asleep as it answers the
            # quiesce heartbeat, and the answer, still on its way, would be stepped (a pump,
            # no message) by its leader inside the window below (2 pumps: 2782 == 2780).
            await c.wait_for(lambda: all_quiesced(c, GROUPS) and all_delivered(c), 20,
                             "every replica of every group quiesced, every message delivered")
            ticks0 = {n: mr.stats.ticks for n, mr in c.nodes.items()}
            msgs0 = {n: mr.stats.messages_sent for n, mr in c.nodes.items()}
            pumps0 = sum(mr.stats.pumps for mr in c.nodes.values())
            live0 = {n: mr.liveness.sent for n, mr in c.nodes.items()}
            await asyncio.sleep(1.0)
            assert all_quiesced(c, GROUPS)
            for n, mr in c.nodes.items():
                ticks = mr.stats.ticks - ticks0[n]
                msgs = mr.stats.messages_sent - msgs0[n]
                live = mr.liveness.sent - live0[n]
                assert ticks > 0
                # Nothing but node liveness: at most one message per peer per tick, whatever
                # the number of groups (30 here; without quiescence 30 heartbeats + answers).
                assert msgs == live <= 2 * ticks, (n, msgs, live, ticks)
            assert sum(mr.stats.pumps for mr in c.nodes.values()) == pumps0  # no group was looked at
            # Every group still takes writes (a proposal wakes it), and falls asleep again.
            res = await asyncio.gather(*(c.g(leaders[gid], gid).propose(b"k=%d" % gid, 10) for gid in GROUPS))
            assert all(r >= 3 for r in res)
            for gid in GROUPS:
                await c.wait_converged(gid)
            await c.wait_for(lambda: all_quiesced(c, GROUPS), 20, "every group quiesced again")
            assert await wait_all_leaders(c, GROUPS) == leaders
        finally:
            await c.close()
    run(main())


def test_a_held_commit_does_not_wake_a_group_its_quiesce_heartbeat_put_to_sleep(tmp_path, run):
    """The commit of a group's last write goes to the followers in a commit-only append that
    MultiRaft holds (commit_hold_s, here longer than a heartbeat interval); the quiesce
    heartbeat carries that commit too. Released after it, the append woke the followers it
    had just put to sleep, whose answers woke the leader: a group round and, in the test
    above, 2 messages of a follower node beyond node liveness (2782 == 2780)."""
    async def main():
        c = Cluster(tmp_path, groups=(1,), tick=0.02, quiesce=True, mr_kw={"commit_hold_s": 0.1})
        await c.start()
        try:
            leaders = await wait_all_leaders(c, (1,))
            await c.wait_for(lambda: all_quiesced(c, (1,)), 20, "the group quiesced")
            await c.g(leaders[1], 1).propose(b"k=1", 10)
            await c.wait_for(lambda: all_quiesced(c, (1,)), 20, "the group quiesced again")
            msgs0 = {n: mr.stats.messages_sent for n, mr in c.nodes.items()}
            live0 = {n: mr.liveness.sent for n, mr in c.nodes.items()}
            pumps0 = sum(mr.stats.pumps for mr in c.nodes.values())
            await asyncio.sleep(0.3)                   # the hold (0.1 s) ends meanwhile
            assert sum(mr.stats.pumps for mr in c.nodes.values()) == pumps0   # nothing woke it
            for n, mr in c.nodes.items():
                assert mr.stats.messages_sent - msgs0[n] == mr.liveness.sent - live0[n], n
            assert c.nodes[leaders[1]].stats.commits_superseded > 0
        finally:
            await c.close()
    run(main())


def test_followers_of_a_dead_leaders_node_wake_and_elect(tmp_path, run):
    async def main():
        c = Cluster(tmp_path, groups=GROUPS, tick=0.02, quiesce=True)
        await c.start()
        try:
            await wait_all_leaders(c, GROUPS)
            await c.wait_for(lambda: all_quiesced(c, GROUPS), 20, "every group quiesced")
            # Node 1 leads some groups; kill it (no message says goodbye).
            led = [gid for gid in GROUPS if c.g(1, gid).is_leader()]
            if not led:  # make it lead one
                await c.g(1, 1).campaign()
                await c.wait_for(lambda: c.g(1, 1).is_leader(), 10, "node 1 leads group 1")
                await c.wait_for(lambda: all_quiesced(c, GROUPS), 20, "every group quiesced again")
                led = [gid for gid in GROUPS if c.g(1, gid).is_leader()]
            t0 = time.monotonic()
            await c.crash(1)
            for gid in led:
                await c.wait_leader(gid, timeout=30, among=[2, 3])
            took = time.monotonic() - t0
            woken = sum(mr.liveness.wakes_silent for mr in c.nodes.values())
            print(f"\n{len(led)} groups led by the killed node: new leaders after {took:.2f}s "
                  f"(election timeout {20 * 0.02:.2f}s); {woken} followers woken by silence")
            assert woken >= len(led)
            res = await asyncio.gather(*(c.g(next(n for n in (2, 3) if c.g(n, gid).is_leader()), gid)
                                         .propose(b"after=%d" % gid, 10) for gid in led))
            assert all(r > 0 for r in res)
        finally:
            await c.close()
    run(main())


def test_a_node_without_quiescence_never_sends_liveness(tmp_path, run):
    async def main():
        c = Cluster(tmp_path, groups=(1, 2), tick=0.02)
        await c.start()
        try:
            await wait_all_leaders(c, (1, 2))
            await asyncio.sleep(0.5)
            assert not any(c.g(n, gid).rn.quiesced for n in c.nodes for gid in (1, 2))
            assert all(mr.liveness.sent == 0 for mr in c.nodes.values())
        finally:
            await c.close()
    run(main())


# ---- NodeLiveness on its own (stub groups: what it reads of a GroupDriver)


class _Raft:
    def __init__(self, state, term, lead, quiesced=True, progress=(1, 2, 3)):
        self.state, self.term, self.lead, self.quiesced = state, term, lead, quiesced
        self.cfg = Config(id=1, rng=random.Random(0), quiesce=True)
        self.trk = type("T", (), {"progress": {p: None for p in progress},
                                  "config": type("C", (), {"voters": JointConfig(progress)})()})()


class _Group:
    def __init__(self, gid, raft):
        self.group_id, self.failed, self.wakes = gid, None, []
        self.rn = type("RN", (), {"raft": raft})()

    def request_wake(self, lease_expired):
        self.wakes.append(lease_expired)


def test_liveness_lists_quiesced_leads_and_wakes_followers_of_silent_or_unlisting_nodes():
    lv = NodeLiveness(node_id=1, silence_ticks=3)
    lead = _Group(10, _Raft(StateRole.LEADER, 4, 1))
    awake_lead = _Group(11, _Raft(StateRole.LEADER, 4, 1, quiesced=False))
    f_of_2 = _Group(20, _Raft(StateRole.FOLLOWER, 7, 2))
    f_of_3 = _Group(30, _Raft(StateRole.FOLLOWER, 5, 3))
    groups = [lead, awake_lead, f_of_2, f_of_3]
    sent = []
    lv.on_tick(groups, lambda gid, m: sent.append((gid, m)))
    assert sorted(m.to for _, m in sent) == [2, 3]
    assert all(gid == LIVENESS_GROUP_ID and m.type == MT.HEARTBEAT and m.frm == 1 for gid, m in sent)
    assert decode_leads(sent[0][1].context) == {(10, 4)}
    # Node 2 keeps talking and lists group 20 at term 7: its follower sleeps on.
    for _ in range(5):
        lv.heard(2)
        lv.received(2, Message(MT.HEARTBEAT, to=1, frm=2, context=encode_leads([(20, 7)])[0]))
        lv.on_tick(groups, lambda gid, m: None)
    assert f_of_2.wakes == []
    # Node 3 has been silent for more than 3 ticks: its follower is woken, lease expired.
    assert f_of_3.wakes and all(f_of_3.wakes)
    # Node 2 no longer lists group 20 (restarted, stepped down, woke): woken, lease kept.
    lv.received(2, Message(MT.HEARTBEAT, to=1, frm=2, context=encode_leads([(20, 6)])[0]))
    assert f_of_2.wakes == [False]
    # Garbage is counted and ignored.
    lv.received(2, Message(MT.HEARTBEAT, to=1, frm=2, context=b"123"))
    assert lv.bad_messages == 1 and f_of_2.wakes == [False]
    # Our quiesced leader of (1, 2, 3): node 3 silent is one of three, node 2 still talks:
    # a quorum of its voters' nodes is alive, it sleeps on.
    assert lead.wakes == [] and lv.wakes_lost_quorum == 0
    # Node 2 goes silent too: the leader has lost its quorum and is woken, lease expired.
    for _ in range(4):
        lv.on_tick(groups, lambda gid, m: None)
    assert lead.wakes and all(lead.wakes) and lv.wakes_lost_quorum >= 1


def test_liveness_contexts_split_at_the_codec_limit():
    pairs = [(g, 1) for g in range(MAX_PAIRS_PER_MESSAGE + 5)]
    ctxs = encode_leads(pairs)
    assert len(ctxs) == 2
    assert set().union(*map(decode_leads, ctxs)) == set(pairs)
    assert encode_leads([]) == [b""]
    with pytest.raises(ValueError):
        NodeLiveness(1, 0)
