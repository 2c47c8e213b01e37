"""Figures read from nodes' Prometheus endpoints (xraft-node --metrics), for xraftctl."""
import urllib.error
import urllib.request
from typing import Optional

from prometheus_client.parser import text_string_to_metric_families

MAX_SCRAPE_BYTES = 16 << 20     # a /metrics page larger than this is not one of ours


def scrape(address: str, timeout: float = 1.0) -> Optional[list]:
    """Every sample of http://address/metrics as (name, labels, value); None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:
            text = resp.read(MAX_SCRAPE_BYTES).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def follower_lag(address: str, group: int = 1, timeout: float = 1.0) -> dict:
    """{follower id: entries behind} as the leader at `address` sees group `group`
    (its xraft_raft_follower_lag_entries); {} if it does not answer or does not lead."""
    samples = scrape(address, timeout) or []
    return {int(labels["peer"]): int(value) for name, labels, value in samples
            if name == "xraft_raft_follower_lag_entries" and labels.get("group") == str(group)}
