"""A deposed leader's proposals end with their real fate when it learns it
(raft_driver.GroupDriver._check_leadership): the entry its successor commits at their index
is theirs -> their result; another entry -> ProposalDropped (it can never apply). Only a
replica that learns nothing within the wait answers UnknownOutcome
(test_driver.py: test_isolated_leader_reports_unknown_outcome_then_majority_moves_on).

The hand-over is a leadership transfer's: a follower gets the TimeoutNow its leader would
send it, while the leader hears nothing (its proposal cannot commit under it)."""
import asyncio

import pytest

from xraft.node.raft.types import Message, MessageType as MT
from xraft.node.runtime.raft_driver import ProposalDropped, UnknownOutcome
from tests.runtime.test_driver import Cluster
from tests.runtime.test_multiraft import run  # noqa: F401 (the fixture)


async def _handed_over_with_a_pending_proposal(c, followers_get_it: bool, count: int = 1):
    """(old leader, its proposal's future (a list of `count` futures if count > 1), the new leader)."""
    old = await c.wait_leader()
    await old.propose(b"before=1", 5)
    await c.wait_converged()
    others = [n for n in c.ids if n != old.node_id]
    for n in others:
        c.net.cut(n, old.node_id)           # the old leader hears nobody: nothing commits
        if not followers_get_it:
            c.net.cut(old.node_id, n)
    before = old.rn.raft.raft_log.last_index()
    futures = [asyncio.ensure_future(old.propose(b"x%d=1" % i if i else b"x=1", 30)) for i in range(count)]
    pending = futures[0] if count == 1 else futures
    target = c.g(others[0])
    if followers_get_it:
        await c.wait_for(lambda: all(c.g(n).rn.raft.raft_log.last_index() >= before + count for n in others),
                         10, "the followers to append the proposal")
    term = old.rn.raft.term
    c.nodes[target.node_id].deliver(old.node_id, [(1, Message(MT.TIMEOUT_NOW, to=target.node_id,
                                                              frm=old.node_id, term=term))])
    await c.wait_for(target.is_leader, 10, "the transfer target elected")
    assert not any(f.done() for f in futures)         # it has heard of nothing yet
    c.net.heal()                                      # the successor's appends depose it
    return old, pending, target


def test_a_deposed_leaders_proposal_that_its_successor_holds_gets_its_result(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            old, pending, new = await _handed_over_with_a_pending_proposal(c, followers_get_it=True)
            index = await asyncio.wait_for(pending, 10)      # its result, not UnknownOutcome
            assert c.sms[(old.node_id, 1)].data["x"] == "1" and not old.is_leader()
            await c.wait_converged()
            assert all(c.sms[(n, 1)].applied_index >= index and c.sms[(n, 1)].data["x"] == "1" for n in c.ids)
        finally:
            await c.close()
    run(main())


def test_a_deposed_leaders_proposal_its_successor_overwrote_is_dropped(tmp_path, run):
    async def main():
        c = await Cluster(tmp_path).start()
        try:
            old, pending, new = await _handed_over_with_a_pending_proposal(c, followers_get_it=False)
            with pytest.raises(ProposalDropped) as ei:       # it can never apply: safe to retry
                await asyncio.wait_for(pending, 10)
            assert "committed with term" in ei.value.reason
            await c.wait_converged()
            assert all("x" not in c.sms[(n, 1)].data for n in c.ids)
        finally:
            await c.close()
    run(main())


def test_a_deposed_leaders_proposals_beyond_its_successors_log_end_when_the_group_quiesces(tmp_path, run):
    """Proposals past the index its successor's first entry took are in nobody's log: no apply
    will settle them, and a quiesced group has no ticks to end the wait. They end UnknownOutcome
    when the group goes quiet, not at their 30 s deadline; the one whose index was taken,
    ProposalDropped."""
    async def main():
        c = await Cluster(tmp_path, quiesce=True).start()
        try:
            old, pending, new = await _handed_over_with_a_pending_proposal(c, followers_get_it=False, count=3)
            with pytest.raises(ProposalDropped):
                await asyncio.wait_for(pending[0], 10)
            for f in pending[1:]:
                with pytest.raises(UnknownOutcome):
                    await asyncio.wait_for(f, 10)
            assert c.g(old.node_id).rn.quiesced
            assert all(k == "before" for n in c.ids for k in c.sms[(n, 1)].data)
        finally:
            await c.close()
    run(main())
