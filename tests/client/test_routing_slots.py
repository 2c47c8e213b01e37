"""The client's copy of the key slot function (client/slots.py) against the node's
(node/engine/slots.py) on arbitrary keys, and both against values redis computes."""
import random

from hypothesis import given, strategies as st

from tests.redis_oracle import RedisOracle, free_port

from xraft.client.slots import SLOT_COUNT, key_slot
from xraft.node.engine import slots as node_slots

# (key, CLUSTER KEYSLOT of redis-server 7.0 --cluster-enabled yes), including the hash tag cases of the redis docs.
REDIS_SLOTS = [
    (b"", 0), (b"foo", 12182), (b"bar", 5061), (b"hello", 866), (b"123456789", 12739),
    (b"{user1000}.following", 3443), (b"{user1000}.followers", 3443), (b"user1000", 3443),
    (b"foo{}{bar}", 8363), (b"foo{{bar}}zap", 4015), (b"foo{bar}{zap}", 5061), (b"{bar", 4015),
]


def test_known_redis_values():
    for key, slot in REDIS_SLOTS:
        assert key_slot(key) == slot, key
        assert node_slots.key_slot(key) == slot, key


def test_slot_count_is_the_nodes():
    assert SLOT_COUNT == node_slots.SLOT_COUNT


_braces = st.lists(st.sampled_from([b"{", b"}", b"a", b"b", b"\x00", b"\xff", b"tag"]), max_size=12).map(b"".join)


@given(st.one_of(st.binary(max_size=64), _braces))
def test_same_slot_as_the_node(key):
    assert key_slot(key) == node_slots.key_slot(key)


def test_same_slot_as_redis_server():
    # An explicit bus port: the default (port + 10000) may be taken, and redis exits.
    oracle = RedisOracle(["--cluster-enabled", "yes", "--cluster-port", str(free_port())])
    try:
        rng = random.Random(10)
        pieces = [b"{", b"}", b"k", b"\x00", b"\xfe", b"user", b"{tag}"]
        for _ in range(300):
            key = b"".join(rng.choice(pieces) for _ in range(rng.randrange(8))) + rng.randbytes(rng.randrange(3))
            assert key_slot(key) == oracle.call("CLUSTER", "KEYSLOT", key), key
    finally:
        oracle.close()
