"""request_stats.RequestStats: Prometheus bucket semantics and bounded label values."""
from xraft.node.server.request_stats import BUCKETS, OTHER, RequestStats


def test_buckets_are_cumulative_and_a_bound_is_inclusive():
    s = RequestStats("resp", ["xadd"])
    s.observe("xadd", BUCKETS[0])           # exactly on the first bound: counted in it (le)
    s.observe("xadd", BUCKETS[0] * 1.5)     # in the second bucket
    s.observe("xadd", BUCKETS[-1] * 10)     # above every bound: +Inf only
    ((name, buckets, total),) = s.snapshot()
    assert name == "xadd"
    assert buckets[0] == (repr(BUCKETS[0]), 1)
    assert buckets[1] == (repr(BUCKETS[1]), 2)
    assert buckets[-2] == (repr(BUCKETS[-1]), 2)
    assert buckets[-1] == ("+Inf", 3)
    assert len(buckets) == len(BUCKETS) + 1
    assert total == BUCKETS[0] + BUCKETS[0] * 1.5 + BUCKETS[-1] * 10


def test_unknown_names_share_one_label_value():
    s = RequestStats("resp", ["xadd"])
    for i in range(1000):
        s.observe("random-%d" % i, 0.001)
    s.observe("xadd", 0.001)
    assert sorted(s.by_name) == [OTHER, "xadd"]
    counts = {name: buckets[-1][1] for name, buckets, _ in s.snapshot()}
    assert counts == {OTHER: 1000, "xadd": 1}
