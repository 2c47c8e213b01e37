"""xraftctl hosts ... and xraftctl nemesis ...: the namespace harness and nemesis runs (root only).

    xraftctl hosts up     --dir DIR [--nodes 5] [--groups G] [--disk-mb 64] [--node-arg ARG ...]
    xraftctl hosts down   --dir DIR
    xraftctl hosts status --dir DIR [--json]
    xraftctl hosts fault  --dir DIR KIND [--node ID] [--seconds S]      (KIND: see `fault --help`)
    xraftctl nemesis run  --dir DIR [--time 120] [--nemesis partition,kill,pause,clock,disk] [--seed N] [--json]
                          [--fsync always|batch|never] [--power-cut majority|all] [--spares 2]
"""
import json
import random
import signal
import sys

import click

from . import faults as fl
from . import local_cluster as lc
from . import nemesis_member as nm
from . import nemesis_run as nr
from . import netns_hosts as nh

dir_option = click.option("--dir", "dir_", required=True, envvar="XRAFT_HOSTS_DIR",
                          type=click.Path(file_okay=False), help="The cluster's directory (env XRAFT_HOSTS_DIR).")


def _progress(msg: str) -> None:
    click.echo(msg, err=True)


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (lc.LocalClusterError, ValueError) as e:
        raise click.ClickException(str(e))


@click.group()
def hosts():
    """A cluster with each node in its own network namespace (root only)."""


@hosts.command("up")
@dir_option
@click.option("--nodes", default=5, show_default=True, type=click.IntRange(1, nh.MAX_NODES))
@click.option("--groups", default=1, show_default=True, type=click.IntRange(1, lc.MAX_GROUPS))
@click.option("--disk-mb", default=nh.DEFAULT_DISK_MB, show_default=True, type=click.IntRange(8, 4096),
              help="Size of each node's own loop-mounted filesystem.")
@click.option("--fsync", type=click.Choice(lc.FSYNC_CHOICES))
@click.option("--node-arg", "node_args", multiple=True, metavar="ARG",
              help="Extra argument for every node, e.g. --node-arg=--snapshot-entries=200.")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(1, 3600))
def hosts_up(dir_, nodes, groups, disk_mb, fsync, node_args, timeout):
    """Make the namespaces, bridge, veths and filesystems and start the nodes."""
    cluster = _run(nh.up, dir_, nodes=nodes, groups=groups, disk_mb=disk_mb, fsync=fsync, node_args=node_args,
                   timeout=timeout, progress=_progress)
    click.echo(f"cluster {cluster.cluster_id}: {len(cluster.nodes)} nodes in namespaces; "
               f"RESP {', '.join(n.resp for n in cluster.nodes)}")


@hosts.command("down")
@dir_option
def hosts_down(dir_):
    """Stop the nodes and remove every namespace, link and mount the harness made."""
    left = _run(nh.down, dir_, progress=_progress)
    if left:
        raise click.ClickException(f"could not remove: {json.dumps(left)}")
    click.echo("down; nothing left")


@hosts.command("status")
@dir_option
@click.option("--json", "as_json", is_flag=True, help="A JSON list: id, netns, address, pid, grpc, resp, role, ...")
def hosts_status(dir_, as_json):
    rows = _run(nh.status, dir_)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'ID':>3}  {'NETNS':14}  {'ADDRESS':15}  {'PID':>7}  {'ROLE':9}  {'TERM':>5}  RESP")
    for r in rows:
        click.echo(f"{r['id']:>3}  {r['netns']:14}  {r['address']:15}  {r['pid'] or '-':>7}  {r['role']:9}  "
                   f"{r['term'] if r['term'] is not None else '-':>5}  {r['resp']}")


FAULTS = ("partition-halves", "partition-leader", "partition-ring", "partition-one-way", "heal-network",
          "loss", "delay", "duplicate", "reorder", "kill", "stop", "cont", "restart", "skew", "strobe", "heal-clocks",
          "fill-disk", "free-disks",
          "power-cut", "heal-all")


@hosts.command("fault")
@dir_option
@click.argument("kind", type=click.Choice(FAULTS))
@click.option("--node", "node_id", type=int, help="The victim (default: a random node).")
@click.option("--seconds", type=float, default=10.0, show_default=True,
              help="skew: the offset (negative: backward); strobe: the ± swing; loss: the percentage; "
              "delay: milliseconds (jitter a quarter of it); duplicate, reorder: the percentage.")
@click.option("--seed", type=int, help="Random choices (halves, victims) from this seed.")
def hosts_fault(dir_, kind, node_id, seconds, seed):
    """Inject or heal one fault by hand."""
    f = _run(fl.Faults, dir_, random.Random(seed))
    victim = node_id if node_id is not None else f.rng.choice(f.ids)
    actions = {
        "partition-halves": f.partition_halves, "partition-leader": f.partition_leader,
        "partition-ring": f.partition_ring, "partition-one-way": f.partition_one_way,
        "heal-network": f.heal_network, "loss": lambda: f.netem(victim, loss_pct=seconds),
        "delay": lambda: f.netem(victim, delay_ms=int(seconds), jitter_ms=int(seconds) // 4),
        "duplicate": lambda: f.netem(victim, duplicate_pct=seconds),
        "reorder": lambda: f.netem(victim, reorder_pct=seconds),
        "kill": lambda: f.kill(victim), "stop": lambda: f.signal(victim, signal.SIGSTOP),
        "cont": lambda: f.signal(victim, signal.SIGCONT), "restart": f.restart_dead,
        "skew": lambda: f.skew(victim, seconds), "heal-clocks": f.heal_clocks,
        "strobe": lambda: _strobe_blocking(f, victim, seconds),
        "fill-disk": lambda: f.fill_disk(victim), "free-disks": f.heal_disks,
        "power-cut": lambda: f.power_cut([victim]),
        "heal-all": lambda: "; ".join(f.heal_all()),
    }
    click.echo(_run(actions[kind]))


def _strobe_blocking(f: fl.Faults, victim: int, delta: float) -> str:
    """The CLI's strobe runs in the foreground until ^C, then resets the clock."""
    f.strobe(victim, delta, 0.5)
    click.echo(f"strobing node {victim}'s clock ±{delta}s; ^C to stop", err=True)
    try:
        f._strobe.join()
    except KeyboardInterrupt:
        pass
    return f.heal_clocks()


@click.group()
def nemesis():
    """Jepsen-style runs: clients, faults, a history and checkers."""


@nemesis.command("run")
@dir_option
@click.option("--time", "time_s", default=120.0, show_default=True, type=click.FloatRange(1, 86400))
@click.option("--nemesis", "kinds", default=",".join(nr.DEFAULT_KINDS), show_default=True,
              help=f"Comma-separated fault kinds: {', '.join(nr.KINDS + nr.EXTRA_KINDS)} "
              "(member: node add/remove under the faults, on a 2-group cluster with spare namespaces).")
@click.option("--seed", type=int, default=None, help="Random seed (default: a random one, printed).")
@click.option("--nodes", default=5, show_default=True, type=click.IntRange(3, nh.MAX_NODES),
              help="Nodes when DIR holds no cluster yet (one is brought up and down again).")
@click.option("--interval", default=4.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="Seconds between faults; each fault is held as long.")
@click.option("--keep", is_flag=True, help="Leave a cluster this run brought up running.")
@click.option("--fsync", type=click.Choice(["always", "batch", "never"]), default=None,
              help="The nodes' --fsync when this run brings the cluster up (default: the node's).")
@click.option("--power-cut", type=click.Choice(nr.POWER_CUTS), default="majority", show_default=True,
              help="The disk fault's power cut (unsynced WAL writes lost) hits a majority or every node.")
@click.option("--spares", default=nm.SPARES, show_default=True, type=click.IntRange(1, nh.MAX_NODES - 3),
              help="With the member kind: spare namespaces for nodes that join during the run.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"ops", "ok", "fail", "info", "anomalies": {checker: count}, "unavailable_s"}.')
def nemesis_run(dir_, time_s, kinds, seed, nodes, interval, keep, fsync, power_cut, spares, as_json):
    """Run the workload under faults; exit 0 only when every checker found nothing."""
    seed = seed if seed is not None else random.randrange(1 << 31)
    rep = _run(nr.run, dir_, time_s, _run(nr.parse_kinds, kinds), seed, nodes=nodes,
               interval=interval, hold=interval, keep=keep, progress=_progress, fsync=fsync,
               power_cut=power_cut, spares=spares)
    click.echo(json.dumps(nr.json_summary(rep)) if as_json else f"seed {seed}\n" + nr.table(rep))
    if any(rep["anomalies"].values()):
        sys.exit(1)
