"""xraftctl: the operator's command line.

    xraftctl local up     --dir DIR [--nodes 3] [--base-port P] [--fsync always|batch|never]
    xraftctl local down   --dir DIR
    xraftctl local status --dir DIR [--json]
    xraftctl local kill   --dir DIR --node ID [--signal KILL|TERM|STOP|CONT]
    xraftctl status       --seed HOST:PORT [--json] [--token-file F] [--tls-ca F --tls-cert F --tls-key F]
    xraftctl leader transfer --seed HOST:PORT --group G --to NODE [--json]
    xraftctl rebalance    --seed HOST:PORT [--dry-run] [--json]
    xraftctl slots move   --seed HOST:PORT --slots FIRST-LAST --to-group G [--json] (ops/slots_cli.py)
    xraftctl compose      [--nodes 3] [--groups G] [--token] > docker-compose.yml
    xraftctl node add|remove --seed HOST:PORT --id N [...] (ops/members_cli.py); local add-node (members_local.py)

`local ...` manages processes on this machine; `status` (and every command to
come that takes --seed) talks to any running cluster through the SDK.

`--dir` may also come from XRAFT_LOCAL_DIR. Progress goes to stderr and results
to stdout, so `xraftctl local status --json | jq` works while `up` still shows
what it is waiting for. Failures exit 1 with the reason (and, for nodes that
would not start, the end of their log).
"""
import functools
import json
import sys
import time

import click

from . import cluster_admin, cluster_status, compose_cli, metrics_scrape, rebalance_cli, slots_cli
from . import local_cluster as lc


def _progress():
    t0 = time.monotonic()

    def emit(msg: str) -> None:
        click.echo(f"[{time.monotonic() - t0:5.1f}s] {msg}", err=True)
    return emit


def _run(fn, *args, **kwargs):
    """Library errors become click errors: `Error: <text>` on stderr, exit status 1."""
    try:
        return fn(*args, **kwargs)
    except (lc.LocalClusterError, cluster_status.StatusError) as e:
        raise click.ClickException(str(e))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Operate xraft clusters."""


@main.group()
def local():
    """A cluster of xraft-node processes on this machine, kept in one directory."""


dir_option = click.option("--dir", "dir_", required=True, envvar="XRAFT_LOCAL_DIR",
                          type=click.Path(file_okay=False), help="The cluster's directory (env XRAFT_LOCAL_DIR).")


@local.command()
@dir_option
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 9), help="Number of voters.")
@click.option("--base-port", type=click.IntRange(1024, 65535),
              help="Use ports P, P+1, ... (gRPC then RESP per node); default: free ports the OS picks.")
@click.option("--fsync", type=click.Choice(lc.FSYNC_CHOICES), help="The nodes' fsync policy (default: the node's).")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds to wait for every node to be ready and a leader to be elected.")
@click.option("--node-arg", "node_args", multiple=True, metavar="ARG",
              help="Extra argument for every node, verbatim (repeatable), e.g. --node-arg=--tick-ms=50. "
                   "Only for a new cluster; kept in cluster.json for restarts.")
@click.option("--node-command", default=None, metavar="CMD",
              help="Command that runs a node (default: this Python with -m xraft.node.server.node_main).")
@click.option("--groups", type=click.IntRange(1, lc.MAX_GROUPS), default=None,
              help=f"Data Raft groups the slots are split over (default {lc.DEFAULT_GROUPS_PER_NODE} per node; "
                   "for a new cluster only: leaders spread over the nodes; --groups 1: one group owns "
                   "every slot).")
@click.option("--metrics-base-port", type=click.IntRange(1024, 65535), default=None,
              help="Node i serves Prometheus metrics on P+i-1 (xraft-node --metrics); new clusters only.")
def up(dir_, nodes, base_port, fsync, timeout, node_args, node_command, groups, metrics_base_port):
    """Start a local cluster, or restart a stopped one from its data.

    A new cluster gets free ports, a random cluster id and a shared secret
    (DIR/secret, mode 0600); each node's first start founds it
    (--initial-cluster-state new). If DIR holds a stopped cluster, its nodes restart
    on the same ports with the same data; nodes still running are left alone. A
    restart never founds again: a node whose data dir was wiped refuses to start
    (it must rejoin through a membership change).
    """
    command = node_command.split() if node_command else None
    if groups is None and not lc.cluster_file(dir_).exists():
        groups = lc.default_groups(nodes)  # a new cluster is sharded (issue 10); a restart keeps its own
    cluster = _run(lc.up, dir_, nodes=nodes, base_port=base_port, fsync=fsync, timeout=timeout,
                   progress=_progress(), node_command=command, node_args=node_args, groups=groups,
                   metrics_base_port=metrics_base_port)
    click.echo(lc.connection_help(cluster, lc.find_leader(cluster)))


@local.command()
@dir_option
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds to wait after SIGTERM before SIGKILL.")
def down(dir_, timeout):
    """Stop every node (SIGTERM; SIGKILL after --timeout, and say so)."""
    progress = _progress()
    killed = _run(lc.down, dir_, timeout=timeout, progress=progress)
    if killed:
        click.echo(f"stopped; node(s) {', '.join(map(str, killed))} had to be killed with SIGKILL "
                   f"(their logs may say why they did not shut down)")
    else:
        click.echo("stopped")


@local.command()
@dir_option
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list (keys id, pid, alive, grpc, resp, role, leads (group ids), ...; "
                   "lag (entries behind the leader) when the cluster serves --metrics).")
@click.option("--timeout", default=1.0, show_default=True, type=click.FloatRange(0.05, 30),
              help="Seconds to wait for each node's INFO raft.")
def status(dir_, as_json, timeout):
    """Each node: pid, alive?, addresses and Raft role ("down" if it does not answer)."""
    cluster = _run(lc.load, dir_)
    rows = lc.status(cluster, timeout=timeout)
    with_lag = _add_lag(cluster, rows, timeout)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"cluster {cluster.cluster_id} in {cluster.dir} (last asked to be {cluster.state})")
    header = f"{'ID':>3}  {'PID':>7}  {'ALIVE':5}  {'ROLE':9}  {'TERM':>5}  {'COMMIT':>7}  {'GRPC':21}  {'RESP':21}  LEADS"
    click.echo(header + ("  LAG" if with_lag else ""))
    for r in rows:
        leads = ",".join(map(str, r["leads"])) if r["leads"] else "-"
        click.echo(f"{r['id']:>3}  {r['pid'] or '-':>7}  {'yes' if r['alive'] else 'no':5}  {r['role']:9}  "
                   f"{_dash(r['term']):>5}  {_dash(r['commit_index']):>7}  {r['grpc']:21}  {r['resp']:21}  {leads}"
                   + (f"  {_dash(r['lag']):>5}" if with_lag else ""))
    if cluster.groups > 1:
        # Many groups: each node leads some (LEADS); one "leader" line would mislead.
        click.echo(f"{cluster.groups} groups; redis-cli -c -p <any RESP port> follows -MOVED to each key's leader")
        return
    leader = lc.leader_of(rows)
    click.echo(f"leader: node {leader['id']} (redis-cli -p {leader['resp'].rsplit(':', 1)[1]})" if leader
               else "leader: none known")


def _add_lag(cluster, rows, timeout) -> bool:
    """One-group clusters with --metrics: each follower's lag in entries, as the leader's
    metrics give it (row "lag"; None where unknown). False when there is nothing to show."""
    leader = lc.leader_of(rows)
    if cluster.groups != 1 or leader is None or not cluster.node(leader["id"]).metrics:
        return False
    lag = metrics_scrape.follower_lag(cluster.node(leader["id"]).metrics, timeout=timeout)
    for r in rows:
        r["lag"] = 0 if r is leader else lag.get(r["id"])
    return True


def _dash(v):
    return "-" if v is None else str(v)


@local.command()
@dir_option
@click.option("--node", "node_id", required=True, type=int, help="The node's id.")
@click.option("--signal", "sig", default="KILL", show_default=True, type=click.Choice(list(lc.SIGNALS),
              case_sensitive=False), help="KILL = crash, TERM = clean stop, STOP/CONT = pause/resume.")
def kill(dir_, node_id, sig):
    """Send a signal to one node (HA testing); `up` restarts it from disk afterwards."""
    node = _run(lc.kill, dir_, node_id, sig)
    click.echo(f"sent SIG{sig.upper()} to node {node_id} (pid {node.pid})")


def seed_options(fn):
    """--seed and the options to reach it (token, TLS), for every command that
    talks to a running cluster; the command gets one `conn` argument."""
    options = [
        click.option("--seed", required=True, envvar="XRAFT_SEED", metavar="HOST:PORT",
                     help="gRPC address of any node of the cluster (env XRAFT_SEED)."),
        click.option("--token-file", type=click.Path(dir_okay=False), envvar="XRAFT_TOKEN_FILE",
                     help="File holding the cluster's bearer token (the nodes' --token-file)."),
        click.option("--tls/--no-tls", "tls", default=None,
                     help="TLS to the nodes (default: on when a TLS file is given)."),
        click.option("--tls-ca", type=click.Path(dir_okay=False), help="PEM of the CA that signed the nodes."),
        click.option("--tls-cert", type=click.Path(dir_okay=False),
                     help="Client certificate (PEM), for nodes run with --tls-require-client-cert."),
        click.option("--tls-key", type=click.Path(dir_okay=False), help="The client certificate's key (PEM)."),
        click.option("--tls-server-name", help="Name checked in the nodes' certificates instead of the host."),
        click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 600),
                     help="Seconds to wait for an answer."),
    ]

    def wrapper(seed, token_file, tls, tls_ca, tls_cert, tls_key, tls_server_name, timeout, **kwargs):
        conn = _run(lambda: cluster_status.Connection(
            seed, token=cluster_status.read_token(token_file) if token_file else None,
            tls_ca=cluster_status.pem(tls_ca, "CA file"), tls_cert=cluster_status.pem(tls_cert, "certificate"),
            tls_key=cluster_status.pem(tls_key, "key file"), tls=tls, server_name=tls_server_name,
            timeout=timeout))
        return fn(conn=conn, **kwargs)
    wrapper = functools.update_wrapper(wrapper, fn)
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


@main.command("status")
@seed_options
@click.option("--json", "as_json", is_flag=True,
              help='Print {"epoch", "nodes": [{"id", "grpc", "resp", "state"}], '
                   '"groups": [{"id", "leader", "voters", "learners", "slots"}]}.')
def cluster_status_command(conn, as_json):
    """The cluster's layout: nodes, Raft groups (leader, voters, learners, slots), the epoch.

    Exits 1 if no node answers, or if the seed runs an xraft without sharding
    (it has no ClusterLayout to show)."""
    layout = _run(cluster_status.fetch_layout, conn)
    moves = slots_cli.migrations_of(conn)
    if as_json:
        click.echo(json.dumps({**layout.to_json(), "migrations": moves}, indent=2))
    else:
        click.echo(cluster_status.table(layout))
        click.echo(slots_cli.migrations_text(moves))


@main.group()
def leader():
    """Raft group leadership."""


@leader.command("transfer")
@seed_options
@click.option("--group", "group_id", required=True, type=click.IntRange(1), help="The Raft group's id.")
@click.option("--to", "to_node", required=True, type=click.IntRange(1), help="The node to lead it (a voter).")
@click.option("--json", "as_json", is_flag=True, help='Print {"group", "leader", "term"}.')
def leader_transfer(conn, group_id, to_node, as_json):
    """Move group G's leadership to node NODE and wait until NODE leads it.

    Exits 0 only when NODE leads G (within --timeout). The nodes then keep NODE as
    G's preferred leader for their leader balancers (in memory: until the nodes
    restart, or until a transfer back to the slot map's preferred leader, which
    clears it), so the balancer does not move G back. Errors say why: unknown group
    or NODE not a voter (fix the command), NODE unreachable, not caught up or slow
    to take over (retriable: try again)."""
    result = _run(cluster_admin.transfer_leader, conn, group_id, to_node)
    click.echo(json.dumps(result) if as_json else cluster_admin.transfer_text(result))


@main.command("rebalance")
@seed_options
@click.option("--dry-run", is_flag=True, help="Only show the plan.")
@click.option("--wait", "wait_s", default=300.0, show_default=True, type=click.FloatRange(1, 86400),
              help="Seconds to watch each slot move.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"epoch", "node_id", "slot_moves": [{"first", "last", "slots", "from_group", '
                   '"to_group"}], "leader_changes": [{"group", "from_node", "to_node"}]} (--dry-run), or '
                   '{"result", "reason", "epoch", "steps"}.')
def rebalance(conn, dry_run, wait_s, as_json):
    """Even out slots over groups and preferred leaders over nodes.

    --dry-run shows the plan. Without it the plan is applied one change at a time (each
    slot move driven to its end, then a new plan), until nothing is left: exit 0 when
    balanced, 1 if a move was aborted (ops/rebalance_cli.py)."""
    if not dry_run:
        result = _run(rebalance_cli.apply, conn, wait_s, not as_json)
        click.echo(json.dumps(result) if as_json else rebalance_cli.text(result))
        if result["result"] != "balanced":
            raise SystemExit(1)
        return
    plan = _run(cluster_admin.rebalance_plan, conn)
    click.echo(json.dumps(plan, indent=2) if as_json else cluster_admin.plan_text(plan))


main.add_command(compose_cli.compose)
slots_cli.register(main, seed_options, _run)
from . import members_cli  # noqa: E402  (xraftctl node add/remove)
members_cli.register(main, seed_options, _run)
from . import members_local  # noqa: E402  (xraftctl local add-node)
members_local.register(local, dir_option, _run, _progress)

from .hanet_cli import hosts as _hosts, nemesis as _nemesis  # noqa: E402  (namespace harness, nemesis runs)
main.add_command(_hosts)
main.add_command(_nemesis)

if __name__ == "__main__":
    sys.exit(main())
