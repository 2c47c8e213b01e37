"""xraftctl leader transfer / rebalance / slots move: rendering and the refusals that need no cluster."""
from click.testing import CliRunner

from xraft.ops import cli, cluster_admin, rebalance_cli

PLAN = {"epoch": 4, "node_id": 2,
        "slot_moves": [{"first": 5000, "last": 5099, "slots": 100, "from_group": 1, "to_group": 3},
                       {"first": 9000, "last": 9000, "slots": 1, "from_group": 2, "to_group": 3}],
        "leader_changes": [{"group": 3, "from_node": 1, "to_node": 2}]}


def test_plan_text_lists_moves_and_leader_changes():
    assert cluster_admin.plan_text(PLAN).splitlines() == [
        "rebalance plan for the slot map of epoch 4 (computed by node 2): 2 slot move(s) (101 slots), "
        "1 preferred leader change(s)",
        "slot moves:",
        "  slots 5000-5099 (100): group 1 -> group 3",
        "  slots 9000-9000 (1): group 2 -> group 3",
        "preferred leaders:",
        "  group 3: node 1 -> node 2",
        "dry run: nothing was applied (`xraftctl rebalance` without --dry-run applies it)"]


def test_an_empty_plan_says_the_cluster_is_balanced():
    empty = dict(PLAN, slot_moves=[], leader_changes=[])
    assert cluster_admin.plan_text(empty) == ("rebalance plan for the slot map of epoch 4 (computed by node 2): "
                                              "nothing to change, the cluster is balanced")
    only_leaders = dict(PLAN, slot_moves=[])
    lines = cluster_admin.plan_text(only_leaders).splitlines()
    assert "slot moves:" not in lines and "  group 3: node 1 -> node 2" in lines


def test_transfer_text():
    assert cluster_admin.transfer_text({"group": 2, "leader": 3, "term": 7}) == \
        "group 2 is now led by node 3 (term 7)"


def test_rebalance_text_lists_the_applied_steps():
    result = {"result": "failed", "reason": "slots 5000-5099: move aborted timeout", "epoch": 9, "steps": [
        {"kind": "preferred_leader", "group": 3, "from_node": 1, "to_node": 2, "epoch": 5},
        {"kind": "slot_move", "first": 5000, "last": 5099, "from_group": 1, "to_group": 3, "result": "aborted",
         "move_s": 61.5}]}
    assert rebalance_cli.text(result).splitlines() == [
        "group 3: preferred leader node 1 -> node 2 (epoch 5)",
        "slots 5000-5099: group 1 -> group 3: aborted in 61.50s",
        "NOT balanced: slots 5000-5099: move aborted timeout"]
    assert rebalance_cli.text(dict(result, result="balanced", steps=[])) == \
        "balanced at epoch 9 (0 change(s) applied)"


def test_rebalance_without_a_node_fails_with_the_reason():
    r = CliRunner().invoke(cli.main, ["rebalance", "--seed", "127.0.0.1:1", "--timeout", "0.5"])
    assert r.exit_code == 1 and "rebalance failed" in r.output


def test_slots_move_checks_the_range_before_connecting():
    for bad in ("200-100", "x", "0-16384"):
        r = CliRunner().invoke(cli.main, ["slots", "move", "--seed", "127.0.0.1:1", "--slots", bad, "--to-group", "2"])
        assert r.exit_code == 1 and "--slots" in r.output, r.output


def test_leader_transfer_needs_group_and_target():
    r = CliRunner().invoke(cli.main, ["leader", "transfer", "--seed", "127.0.0.1:1", "--group", "1"])
    assert r.exit_code == 2 and "--to" in r.output
    r = CliRunner().invoke(cli.main, ["leader", "transfer", "--seed", "127.0.0.1:1", "--group", "0", "--to", "1"])
    assert r.exit_code == 2 and "--group" in r.output


def test_an_unreachable_seed_is_an_error_not_a_traceback():
    r = CliRunner().invoke(cli.main, ["leader", "transfer", "--seed", "127.0.0.1:1", "--group", "1", "--to", "2",
                                      "--timeout", "0.5"])
    assert r.exit_code == 1 and r.output.startswith("Error: "), r.output
    assert "Traceback" not in r.output
