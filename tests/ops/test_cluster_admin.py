"""xraftctl leader transfer / rebalance: rendering and the refusals that need no cluster."""
from click.testing import CliRunner

from xraft.ops import cli, cluster_admin

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
        "dry run: nothing was applied (slot moves need the metadata group, not built yet)"]


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


def test_rebalance_without_dry_run_refuses_before_connecting():
    r = CliRunner().invoke(cli.main, ["rebalance", "--seed", "127.0.0.1:1"])
    assert r.exit_code == 1
    assert "slot moves need the metadata group, not built yet" in r.output and "nothing was changed" in r.output


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
