"""key_slot against redis-server 7.0 in cluster mode (CLUSTER KEYSLOT)."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.redis_oracle import RedisOracle
from xraft.node.engine.slots import SLOT_COUNT, crc16, hash_tag, key_slot

pytestmark = pytest.mark.redis

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def cluster_redis(tmp_path_factory):
    conf = tmp_path_factory.mktemp("cluster") / "nodes.conf"
    oracle = RedisOracle(extra_config=["--cluster-enabled", "yes", "--cluster-config-file", str(conf)])
    yield oracle
    oracle.close()


def test_crc16_xmodem_check_value():
    assert crc16(b"123456789") == 0x31C3      # the catalogued CRC-16/XMODEM check value
    assert crc16(b"") == 0


@pytest.mark.parametrize("key,tag", [
    (b"foo", b"foo"), (b"{user}.a", b"user"), (b"a{b}c{d}", b"b"), (b"{}x", b"{}x"),
    (b"{}{a}", b"{}{a}"), (b"{{a}}", b"{a"), (b"a{b", b"a{b"), (b"}{a}", b"a"), (b"{", b"{"),
])
def test_hash_tag_rule(key, tag):
    assert hash_tag(key) == tag


def test_known_slots(cluster_redis):
    for key in [b"", b"foo", b"{user1000}.following", b"user1000", b"\xff\x00{", b"{}", b"{a}" * 3]:
        assert key_slot(key) == cluster_redis.call(b"CLUSTER", b"KEYSLOT", key), key
    assert key_slot(b"foo") == 12182


KEY = st.one_of(
    st.binary(max_size=40),
    st.lists(st.sampled_from([b"{", b"}", b"a", b"bc", b"\x00", b"\xff", b"{}", b"user"]), max_size=10)
    .map(b"".join),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(KEY, min_size=1, max_size=20))
def test_key_slot_matches_cluster_keyslot(cluster_redis, keys):
    for key in keys:
        slot = key_slot(key)
        assert 0 <= slot < SLOT_COUNT
        assert slot == cluster_redis.call(b"CLUSTER", b"KEYSLOT", key), key
