"""Per-command request counts and latency histograms, cheap enough for every request.

The front ends (resp_server, grpc_service) call observe() once per command when
the node runs with --metrics; server/metrics.py turns the counts into Prometheus
histograms at scrape time. Recording is a dict lookup, a bisect and two list
updates on the event loop thread: no lock, no prometheus_client call per request
(its labelled Histogram costs several times more, with a lock).

Label values are bounded: a name not in `known` (the commands and RPCs the node
serves) is counted as "other", so a client sending random command names cannot
grow the table.
"""
from bisect import bisect_left
from typing import Iterable

# Seconds; Prometheus `le` buckets (an observation equal to a bound counts in it).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0)
OTHER = "other"


class RequestStats:
    """Histograms by command name for one API ("resp" or "grpc")."""

    def __init__(self, api: str, known: Iterable[str]):
        self.api = api
        self.known = frozenset(known)
        # name -> [count in bucket 0, ..., count in bucket n-1, count above the last bound, sum]
        self.by_name: dict = {}

    def observe(self, name: str, seconds: float) -> None:
        h = self.by_name.get(name)
        if h is None:
            if name not in self.known:
                name = OTHER
            h = self.by_name.setdefault(name, [0] * (len(BUCKETS) + 1) + [0.0])
        h[bisect_left(BUCKETS, seconds)] += 1
        h[-1] += seconds

    def snapshot(self) -> list:
        """[(name, [(upper bound str, cumulative count), ..., ("+Inf", total)], sum)] in name order."""
        out = []
        for name in sorted(self.by_name):
            h = self.by_name[name]
            cumulative, running = [], 0
            for bound, n in zip(BUCKETS + (float("inf"),), h[:-1]):
                running += n
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            out.append((name, cumulative, h[-1]))
        return out
