"""`xraftctl compose`: print a docker-compose.yml for an N-node cluster (ops/compose.py)."""
import click

from . import compose as cp
from .local_cluster import FSYNC_CHOICES, MAX_GROUPS


@click.command("compose")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, cp.MAX_NODES), help="Number of voters.")
@click.option("--groups", default=1, show_default=True, type=click.IntRange(1, MAX_GROUPS),
              help="Data Raft groups the slots are split over (xraft-node --groups).")
@click.option("--cluster-id", default=cp.ComposeOptions.cluster_id, show_default=True, help="The cluster's id.")
@click.option("--fsync", type=click.Choice(FSYNC_CHOICES), default=None,
              help="The nodes' fsync policy (default: the node's).")
@click.option("--token", is_flag=True,
              help=f"Serve the gRPC client API behind a bearer token (compose secret from {cp.TOKEN_SOURCE}).")
@click.option("--host-ip", default=cp.ComposeOptions.host_ip, show_default=True,
              help="Docker-host address the ports are published on (0.0.0.0: every interface).")
@click.option("--build-context", default=cp.ComposeOptions.build_context, show_default=True,
              help="The xraft checkout, relative to the folder the compose file is written to.")
def compose(nodes, groups, cluster_id, fsync, token, host_ip, build_context):
    """Print docker-compose.yml: one service per node, Prometheus and Grafana.

    Write it beside ops/docker/Dockerfile (the default --build-context is that folder's
    ../..): `xraftctl compose --nodes 5 > ops/docker/docker-compose.yml`."""
    opts = cp.ComposeOptions(nodes=nodes, groups=groups, cluster_id=cluster_id, fsync=fsync, token=token,
                             host_ip=host_ip, build_context=build_context)
    try:
        click.echo(cp.render(opts), nl=False)
    except cp.ComposeError as e:
        raise click.ClickException(str(e))
