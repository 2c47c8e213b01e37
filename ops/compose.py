"""docker-compose.yml for an N-node xraft cluster, with Prometheus and Grafana.

    xraftctl compose --nodes 3 [--groups G] > ops/docker/docker-compose.yml

The nodes' command lines come from topology.node_argv, the function
`xraftctl local up` starts its processes with, so a container runs the flags
the tests run. Per node `xraft-<i>` (i = 1..N):

    hostname     xraft-<i>; peers dial xraft-<j>:<gRPC port of j> on the compose network
    ports        RESP 6378+i, gRPC 7000+i, metrics 9100+i: the same inside the container
                 and published on --host-ip (default 127.0.0.1: the client APIs have no
                 password unless --token is given, so they are not put on every interface).
                 One port number per node, never reused, so a host that resolves the
                 service names (an /etc/hosts line) can follow -MOVED and SDK layouts.
    volume       xraft-<i>-data at /var/lib/xraft (the node's --data-dir is .../data)
    secrets      xraft-cluster-secret (--secret-file), and with --token
                 xraft-client-token (--token-file, the gRPC bearer token)
    healthcheck  xraft-health on its gRPC port: healthy = SERVING = every group it
                 hosts knows a leader (ops/health_probe.py)
    restart      unless-stopped (a crashed or fail-stopped node, exit 70, comes back
                 from its volume; `docker compose kill`/`stop` is left alone)

Every node is started with --initial-cluster-state new: a node founds the
cluster only in an empty data dir, and the flag is ignored once the volume
holds its state (node_config.py), as etcd's is. A node whose volume was lost
comes back with a new incarnation, and its peers refuse it (README).

depends_on: the nodes do not wait for each other. A node turns healthy only
once its group has a leader, i.e. once a majority runs; a node that waited for
another's health would wait forever. Prometheus starts once the nodes are
started (it scrapes whoever answers) and Grafana once Prometheus is healthy.

Prometheus' configuration and Grafana's provisioning are inline compose
`configs` (`content:`, Docker Compose 2.23 or later); the dashboard is the
shipped file ops/docker/grafana/xraft-dashboard.json. The output is a pure
function of the arguments (same arguments, same bytes): the committed
ops/docker/docker-compose.yml is checked against it by a test.
"""
import copy
from dataclasses import dataclass
from typing import Optional

import yaml

from .topology import NodeSpec, Topology, node_argv

IMAGE = "xraft:dev"
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.1"
GRAFANA_IMAGE = "grafana/grafana:11.1.4"
RESP_PORT0, GRPC_PORT0, METRICS_PORT0 = 6378, 7000, 9100   # node i: base + i
PROMETHEUS_PORT, GRAFANA_PORT = 9090, 3000
DATA_MOUNT = "/var/lib/xraft"              # the image's VOLUME (ops/docker/Dockerfile)
SECRET_NAME, TOKEN_NAME = "xraft-cluster-secret", "xraft-client-token"
SECRET_SOURCE, TOKEN_SOURCE = "./secrets/cluster-secret", "./secrets/client-token"
DASHBOARD_SOURCE = "./grafana/xraft-dashboard.json"
MAX_NODES = 9                              # what `local up` allows; the port plan fits 99
SCRAPE_INTERVAL = "5s"


class ComposeError(ValueError):
    """The requested compose file cannot be made; the message says why."""


@dataclass(frozen=True)
class ComposeOptions:
    nodes: int = 3
    groups: int = 1
    cluster_id: str = "xraft-compose"
    fsync: Optional[str] = None
    token: bool = False                    # serve the gRPC client API behind a bearer token
    host_ip: str = "127.0.0.1"             # where published ports listen on the docker host
    build_context: str = "../.."           # the checkout, relative to the compose file's folder


def service_name(node_id: int) -> str:
    return f"xraft-{node_id}"


def ports(node_id: int) -> tuple:
    """(RESP, gRPC, metrics) port of node `node_id`, inside its container and on the host."""
    return RESP_PORT0 + node_id, GRPC_PORT0 + node_id, METRICS_PORT0 + node_id


def topology(opts: ComposeOptions) -> Topology:
    nodes = []
    for i in range(1, opts.nodes + 1):
        resp, grpc, metrics = ports(i)
        name = service_name(i)
        nodes.append(NodeSpec(id=i, grpc=f"0.0.0.0:{grpc}", resp=f"0.0.0.0:{resp}",
                              data_dir=f"{DATA_MOUNT}/data", grpc_advertise=f"{name}:{grpc}",
                              resp_advertise=f"{name}:{resp}", metrics=f"0.0.0.0:{metrics}"))
    return Topology(cluster_id=opts.cluster_id, nodes=tuple(nodes), secret_file=f"/run/secrets/{SECRET_NAME}",
                    groups=opts.groups, fsync=opts.fsync,
                    token_file=f"/run/secrets/{TOKEN_NAME}" if opts.token else None)


def _node_service(opts: ComposeOptions, topo: Topology, node: NodeSpec) -> dict:
    resp, grpc, metrics = ports(node.id)
    name = service_name(node.id)
    return {
        "image": IMAGE,
        "build": {"context": opts.build_context, "dockerfile": "ops/docker/Dockerfile"},
        "hostname": name,
        "command": node_argv(topo, node, founding=True),
        "ports": [f"{opts.host_ip}:{p}:{p}" for p in (resp, grpc, metrics)],
        "volumes": [{"type": "volume", "source": f"{name}-data", "target": DATA_MOUNT}],
        "secrets": [SECRET_NAME] + ([TOKEN_NAME] if opts.token else []),
        "healthcheck": {
            "test": ["CMD", "xraft-health", f"127.0.0.1:{grpc}", "--timeout", "3"],
            "interval": "5s", "timeout": "4s", "retries": 3, "start_period": "30s",
        },
        "restart": "unless-stopped",
        # SIGTERM's shutdown drains writes and hands leadership over (node_main): give it time.
        "stop_grace_period": "25s",
    }


def prometheus_config(opts: ComposeOptions) -> str:
    targets = [f"{service_name(i)}:{ports(i)[2]}" for i in range(1, opts.nodes + 1)]
    conf = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [{"job_name": "xraft", "static_configs": [{"targets": targets}]}],
    }
    return yaml.safe_dump(conf, sort_keys=False)


GRAFANA_DATASOURCE = """\
apiVersion: 1
datasources:
  - name: Prometheus
    uid: xraft-prometheus
    type: prometheus
    access: proxy
    url: http://prometheus:9090
    isDefault: true
"""

GRAFANA_DASHBOARDS = """\
apiVersion: 1
providers:
  - name: xraft
    folder: xraft
    type: file
    options:
      path: /var/lib/grafana/dashboards
"""


def compose(opts: ComposeOptions) -> dict:
    """The compose file as a dict (what the YAML text parses back to)."""
    if not 1 <= opts.nodes <= MAX_NODES:
        raise ComposeError(f"--nodes {opts.nodes}: expected 1 to {MAX_NODES}")
    topo = topology(opts)
    services = {service_name(n.id): _node_service(opts, topo, n) for n in topo.nodes}
    services["prometheus"] = {
        "image": PROMETHEUS_IMAGE,
        "command": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"],
        "configs": [{"source": "prometheus-config", "target": "/etc/prometheus/prometheus.yml"}],
        "volumes": [{"type": "volume", "source": "prometheus-data", "target": "/prometheus"}],
        "ports": [f"{opts.host_ip}:{PROMETHEUS_PORT}:{PROMETHEUS_PORT}"],
        "depends_on": {service_name(n.id): {"condition": "service_started"} for n in topo.nodes},
        "healthcheck": {"test": ["CMD", "wget", "-q", "--spider", f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready"],
                        "interval": "5s", "timeout": "4s", "retries": 5},
        "restart": "unless-stopped",
    }
    services["grafana"] = {
        "image": GRAFANA_IMAGE,
        "environment": {"GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"},
        "configs": [
            {"source": "grafana-datasource", "target": "/etc/grafana/provisioning/datasources/xraft.yml"},
            {"source": "grafana-dashboards", "target": "/etc/grafana/provisioning/dashboards/xraft.yml"},
        ],
        "volumes": [{"type": "bind", "source": DASHBOARD_SOURCE,
                     "target": "/var/lib/grafana/dashboards/xraft.json", "read_only": True}],
        "ports": [f"{opts.host_ip}:{GRAFANA_PORT}:{GRAFANA_PORT}"],
        "depends_on": {"prometheus": {"condition": "service_healthy"}},
        "restart": "unless-stopped",
    }
    secrets = {SECRET_NAME: {"file": SECRET_SOURCE}}
    if opts.token:
        secrets[TOKEN_NAME] = {"file": TOKEN_SOURCE}
    volumes = {f"{service_name(n.id)}-data": {} for n in topo.nodes}
    volumes["prometheus-data"] = {}
    return {
        "name": "xraft",
        "services": services,
        "volumes": volumes,
        "secrets": secrets,
        "configs": {
            "prometheus-config": {"content": prometheus_config(opts)},
            "grafana-datasource": {"content": GRAFANA_DATASOURCE},
            "grafana-dashboards": {"content": GRAFANA_DASHBOARDS},
        },
    }


def cli_args(opts: ComposeOptions) -> str:
    """The `xraftctl compose` arguments that give `opts` (defaults left out)."""
    default = ComposeOptions()
    args = [f"--nodes {opts.nodes}"]
    for name in ("groups", "cluster_id", "fsync", "host_ip", "build_context"):
        value = getattr(opts, name)
        if value != getattr(default, name):
            args.append(f"--{name.replace('_', '-')} {value}")
    if opts.token:
        args.append("--token")
    return " ".join(args)


def header(opts: ComposeOptions) -> str:
    return (f"# Generated by `xraftctl compose {cli_args(opts)}` (ops/compose.py); regenerate it, do not edit.\n"
            f"# Before `docker compose up`: the peer secret in {SECRET_SOURCE}"
            + (f" and the client token in {TOKEN_SOURCE}" if opts.token else "")
            + " (README, \"Testing HA\").\n")


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (the inline configs) as literal | blocks."""


def _str(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(opts: ComposeOptions) -> str:
    """The docker-compose.yml text: the same options always give the same bytes."""
    # Deep copy: PyYAML writes &anchors for objects it meets twice; each service gets its own.
    doc = copy.deepcopy(compose(opts))
    return header(opts) + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
