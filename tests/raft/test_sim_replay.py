"""Replays: the simulator is deterministic, its checker can fail, and every seed that once
found a bug stays fixed.

A seed (with its step count) is the whole reproduction: configuration, schedule,
faults and the nodes' randomness all come from it.
"""
from __future__ import annotations

import pytest

from xraft.node.raft.progress import ProgressState
from xraft.node.raft.types import Message, MessageType as MT, StateRole

from tests.raft.sim import simulator
from tests.raft.sim.checker import SafetyViolation
from tests.raft.sim.network import NetConfig

# (seed, steps, what it found) — see docs/simulator.md for each bug's story. Each of these
# failed on the core of commit 24daada (or, for the harness bug, on the earlier harness) and
# passes now. Bug 5 was found under an earlier scheduler and is pinned by a focused test in
# test_core_regressions.py instead. Seeds of the client-heavy linearizability runs are in
# FOUND_BUGS_CLIENT_HEAVY (test_sim_linearizable.py's configuration).
FOUND_BUGS = [
    (0, 1500, "bug 1: new learner refuses the leader's older snapshot, catch-up livelock"),
    (25, 1500, "bug 1: new learner refuses the leader's older snapshot, catch-up livelock"),
    (3, 1500, "bug 2: restart refused when the log was compacted below the snapshot index"),
    (11, 1500, "bug 2: restart refused when the log was compacted below the snapshot index"),
    (18, 1500, "bug 3: reordered snapshot chunks never assembled, catch-up livelock"),
    (49, 1500, "bug 3: reordered snapshot chunks never assembled, catch-up livelock"),
    (179, 1500, "bug 4: forwarded proposal back at its proposer raised StepError"),
    (320, 1500, "bug 4: forwarded proposal back at its proposer raised StepError"),
    (445, 1500, "harness: a crash lost MsgSnap chunks without report_snapshot(False)"),
    (1335, 1500, "harness: a paused leader's report_snapshot was dropped, follower left behind"),
]
FOUND_BUGS_CLIENT_HEAVY = [
    (9702413, 2000, "bug 10: a learner that took one snapshot older than its add refused a second one"),
    (9651458, 2000, "bug 11: a follower past a re-sent snapshot kept silent; the chunk window waited forever"),
    (9652151, 2000, "bug 11: a restarted follower's rejection lacked its prefix; every resend began past it"),
]


@pytest.mark.parametrize("seed,steps,what", FOUND_BUGS, ids=[f"seed{s}" for s, _, _ in FOUND_BUGS])
def test_replayed_seed_stays_fixed(seed, steps, what):
    simulator.run(seed, simulator.config_for_seed(seed, steps=steps), test_file="tests/raft/test_sim_replay.py")


@pytest.mark.parametrize("seed,steps,what", FOUND_BUGS_CLIENT_HEAVY,
                         ids=[f"seed{s}" for s, _, _ in FOUND_BUGS_CLIENT_HEAVY])
def test_replayed_client_heavy_seed_stays_fixed(seed, steps, what):
    simulator.run(seed, simulator.client_heavy_config(seed, steps),
                  test_file="tests/raft/test_sim_linearizable.py")


def test_same_seed_same_run():
    """Determinism: two runs of a seed are event-for-event identical (so a seed reproduces)."""
    for seed in (3, 17, 4242):
        a = simulator.run(seed, simulator.config_for_seed(seed, steps=600))
        b = simulator.run(seed, simulator.config_for_seed(seed, steps=600))
        assert a.trace_digest == b.trace_digest
        assert [(o.kind, o.key, o.value, o.output, o.call, o.ret) for o in a.history] == \
               [(o.kind, o.key, o.value, o.output, o.call, o.ret) for o in b.history]
        assert a.settle_steps == b.settle_steps and a.net == b.net


def test_different_seeds_differ():
    digests = {simulator.run(s, simulator.config_for_seed(s, steps=300)).trace_digest for s in range(5)}
    assert len(digests) == 5


CHECKER_VIOLATIONS = ("election safety", "log matching", "leader completeness", "state machine safety",
                      "state hash", "durability", "not linearizable", "commit went back")


def test_sending_persisted_messages_before_persisting_is_caught():
    """Self-test: acks and votes sent before fsync, plus crashes, must break a checked invariant."""
    reasons = []
    for seed in range(60):
        cfg = simulator.SimConfig(nodes=3, steps=1500, net=NetConfig(max_delay=3), w_crash=0.03,
                                  w_campaign=0.02, clients=4, inject=frozenset({"early_persisted_messages"}))
        try:
            simulator.run(seed, cfg)
        except simulator.SimFailure as e:
            reasons.append(e.reason)
    by_checker = [r for r in reasons if any(v in r for v in CHECKER_VIOLATIONS)]
    assert by_checker, f"the checker never caught the broken harness; failures: {reasons[:3]}"


def test_a_corrupted_apply_is_caught():
    """Self-test: one node applying a different command at an index is a State Machine Safety breach."""
    cfg = simulator.SimConfig(nodes=3, steps=1500, inject=frozenset({"flip_apply"}))
    with pytest.raises(simulator.SimFailure) as info:
        simulator.run(11, cfg)
    assert "state machine safety" in info.value.reason or "state hash" in info.value.reason
    assert "XRAFT_SIM_SEED=11" in str(info.value) and "reproduce" in str(info.value)


def test_the_network_applies_the_transports_link_rule():
    """Issue 9 C5: the simulated network refuses what GrpcTransport refuses (types.link_violation):
    a message on node 2's link claiming another sender fails the seed, unless it is a forwarded
    request. Seeds 179 and 320 forward requests twice, over a link that is not their frm's."""
    sim = simulator.Simulation(5, simulator.config_for_seed(5, steps=10))
    sim.send(Message(MT.READ_INDEX, to=3, frm=1, context=b"r"), via=2)  # forwarded twice: fine
    sim.deliver([0])
    sim.send(Message(MT.HEARTBEAT, to=3, frm=1, term=sim.nodes[1].rn.raft.term), via=2)
    with pytest.raises(SafetyViolation, match="would end the stream of node 2: HEARTBEAT message from 1"):
        sim.deliver([0])
    relayed = 0
    for seed in (179, 320):
        sim = simulator.Simulation(seed, simulator.config_for_seed(seed, steps=1500))
        sim.run()
        relayed += sim.relayed
    assert relayed > 0, "no request was delivered over a link other than its originator's"


def test_a_paused_leader_gets_its_snapshot_report_on_resume():
    """Issue 9 A, the harness side: a report_snapshot for a paused leader was dropped, so its
    progress stayed in SNAPSHOT (always paused) and the follower was left behind for good
    (seed 1335 above). Reports wait for the resume, as a stopped process's completions do."""
    sim = simulator.Simulation(7, simulator.SimConfig(nodes=3, w_client=0.0))
    lead = sim.nodes[1]
    lead.call(lead.rn.campaign)
    while lead.role() != StateRole.LEADER:
        sim.step_once(faults=False)
    pr = lead.rn.raft.trk.progress[2]
    pr.become_snapshot(lead.rn.raft.raft_log.last_index())  # as if a MsgSnap were in flight
    lead.paused = True
    lead.report_snapshot(2, True)
    lead.report_unreachable(3)
    assert pr.state == ProgressState.SNAPSHOT  # nothing reaches a stopped process...
    lead.resume()
    assert pr.state == ProgressState.PROBE  # ...until it runs again
    lead.paused = True
    lead.report_snapshot(3, False)
    lead.crash()
    lead.resume()  # a crash discards them: that progress is gone with the process
    assert not lead.deferred_snap_reports and not lead.deferred_unreachable
