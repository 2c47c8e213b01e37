"""`xraftctl compose`: the generated docker-compose.yml, checked statically (no Docker engine here).

Every node's command line is parsed by the node's own argument parser, and its
peers, ports, volumes, secrets and health check are checked against the rest of
the file; the committed ops/docker/docker-compose.yml must be exactly what the
generator prints today.
"""
import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from xraft.node.server.config import parse_args
from xraft.node.server.metrics import Metrics, NodeCollector
from xraft.ops import compose as cp
from xraft.ops.cli import main as xraftctl

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "ops" / "docker"


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_committed_compose_file_is_what_the_generator_prints():
    result = CliRunner().invoke(xraftctl, ["compose", "--nodes", "3"])
    assert result.exit_code == 0, result.output
    committed = (DOCKER / "docker-compose.yml").read_text()
    assert result.output == committed, "regenerate: xraftctl compose --nodes 3 > ops/docker/docker-compose.yml"
    assert cp.render(cp.ComposeOptions(nodes=3)) == committed


def check_compose(text: str, opts: cp.ComposeOptions) -> dict:
    """Every static property of one generated file; returns {node id: NodeConfig}."""
    doc = yaml.safe_load(text)
    services = doc["services"]
    node_names = [f"xraft-{i}" for i in range(1, opts.nodes + 1)]
    assert set(services) == set(node_names) | {"prometheus", "grafana"}
    configs = {}
    for i, name in enumerate(node_names, 1):
        svc = services[name]
        cfg = parse_args(svc["command"])          # the node's real parser: exits/raises on a bad flag
        configs[i] = cfg
        assert cfg.id == i and svc["hostname"] == name
        assert cfg.cluster_id == opts.cluster_id and cfg.groups == opts.groups
        assert cfg.initial_cluster_state == "new"  # ignored once the volume holds the node's state
        # Peers: every node, by service name and that node's own gRPC / RESP listen port.
        assert sorted(cfg.peers) == list(range(1, opts.nodes + 1))
        assert sorted(cfg.resp_peers) == list(range(1, opts.nodes + 1))
        for j, addr in cfg.peers.items():
            assert addr == f"xraft-{j}:{port_of(cp.topology(opts).node(j).grpc)}"
            assert cfg.resp_peers[j] == f"xraft-{j}:{port_of(cp.topology(opts).node(j).resp)}"
        assert cfg.peers[i] == f"{name}:{port_of(cfg.grpc)}"
        # Ports: what the node listens on is published, on the same number, on host_ip only.
        published = {tuple(p.rsplit(":", 2)) for p in svc["ports"]}
        listen = [port_of(a) for a in (cfg.resp, cfg.grpc, cfg.metrics)]
        assert published == {(opts.host_ip, str(p), str(p)) for p in listen}
        assert all(a.startswith("0.0.0.0:") for a in (cfg.resp, cfg.grpc, cfg.metrics))
        # Data: the data dir is inside this node's own named volume.
        (vol,) = svc["volumes"]
        assert vol["type"] == "volume" and vol["source"] == f"{name}-data" and vol["source"] in doc["volumes"]
        assert cfg.data_dir.startswith(vol["target"] + "/")
        # Secrets: the files the node reads are the compose secrets mounted in /run/secrets.
        wanted = {cfg.secret_file} | ({cfg.token_file} if cfg.token_file else set())
        assert {f"/run/secrets/{s}" for s in svc["secrets"]} == wanted
        assert all(s in doc["secrets"] and doc["secrets"][s]["file"].startswith("./secrets/") for s in svc["secrets"])
        assert (cfg.token_file is not None) == opts.token
        # Health: the probe asks this node's own gRPC port.
        hc = svc["healthcheck"]
        assert hc["test"][:3] == ["CMD", "xraft-health", f"127.0.0.1:{port_of(cfg.grpc)}"]
        assert svc["restart"] == "unless-stopped"
        assert "depends_on" not in svc              # a node waiting on another's health would wait forever
        assert svc["build"]["dockerfile"] == "ops/docker/Dockerfile"
    # Listen ports never collide between nodes (they share the docker host's published ports).
    ports = [port_of(a) for c in configs.values() for a in (c.resp, c.grpc, c.metrics)]
    assert len(ports) == len(set(ports))
    # Prometheus scrapes every node's --metrics port by service name.
    prom = yaml.safe_load(doc["configs"]["prometheus-config"]["content"])
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"xraft-{i}:{port_of(c.metrics)}" for i, c in configs.items()]
    assert set(services["prometheus"]["depends_on"]) == set(node_names)
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    assert services["prometheus"]["healthcheck"]["test"][0] == "CMD"
    dash = services["grafana"]["volumes"][0]["source"]
    assert (DOCKER / dash).is_file()
    return configs


def test_committed_three_node_file_parses_and_holds_together():
    configs = check_compose((DOCKER / "docker-compose.yml").read_text(), cp.ComposeOptions(nodes=3))
    assert len(configs) == 3


@pytest.mark.parametrize("opts", [cp.ComposeOptions(nodes=5), cp.ComposeOptions(nodes=1),
                                  cp.ComposeOptions(nodes=3, groups=3, token=True, fsync="batch",
                                                    host_ip="0.0.0.0", cluster_id="prod-1")])
def test_variants_parse_and_hold_together(opts):
    text = cp.render(opts)
    configs = check_compose(text, opts)
    assert len(configs) == opts.nodes
    if opts.fsync:
        assert all(c.fsync == opts.fsync for c in configs.values())
    # The header names the command that regenerates the file, options included.
    first = text.splitlines()[0]
    assert f"xraftctl compose {cp.cli_args(opts)}" in first
    result = CliRunner().invoke(xraftctl, ["compose"] + cp.cli_args(opts).split())
    assert result.exit_code == 0 and result.output == text


def test_too_many_nodes_is_refused():
    result = CliRunner().invoke(xraftctl, ["compose", "--nodes", "10"])
    assert result.exit_code != 0


def test_local_cluster_and_compose_build_argv_with_the_same_function(tmp_path):
    """One topology description: a local cluster's node command line is topology.node_argv's."""
    from xraft.ops import local_cluster as lc
    from xraft.ops.topology import node_argv
    cluster = lc.new_cluster(str(tmp_path / "c"), 3, metrics_base_port=None)
    topo = lc.topology(cluster)
    argv = lc.node_argv(cluster, cluster.nodes[0])
    assert argv[len(cluster.node_command):] == node_argv(topo, topo.node(1), founding=True)
    cfg = parse_args(argv[len(cluster.node_command):])
    assert cfg.peers == {n.id: n.grpc for n in cluster.nodes} and cfg.metrics is None


def test_dashboard_queries_name_only_metrics_the_node_exports():
    dash = json.loads((DOCKER / "grafana" / "xraft-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all(t["datasource"]["uid"] == "xraft-prometheus" for p in dash["panels"] for t in p["targets"])
    metrics = Metrics()
    metrics.add_collector(NodeCollector(1, lambda: {}, [], lambda: {}))
    exported = set(re.findall(r"^# TYPE (\w+) ", metrics.exposition().decode(), re.M))
    used = set(re.findall(r"\bxraft_\w+", " ".join(exprs)))
    suffixes = ("_bucket", "_count", "_sum", "_total")
    unknown = {m for m in used if m not in exported and not any(m.endswith(s) and m[:-len(s)] in exported
                                                                     for s in suffixes)}
    assert not unknown, unknown
