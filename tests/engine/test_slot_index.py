"""The keyspace's per-slot key index (Keyspace.slot_keys) stays exactly the keys of
`data` under their slots through every command that creates, deletes, renames or
flushes keys, and is rebuilt (not stored) when a dump is loaded."""
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xraft.node.engine.commands import execute, lookup
from xraft.node.engine.dump import dump_keyspace, load_keyspace
from xraft.node.engine.errors import EngineError
from xraft.node.engine.keyspace import Keyspace
from xraft.node.engine.slots import key_slot

EXAMPLES = int(os.environ.get("XRAFT_DIFF_EXAMPLES", "200"))
KEYS = [b"a", b"b", b"{a}1", b"{a}2", b"{b}", b"s", b"{s}t"]


def derived(db: Keyspace) -> dict:
    out = {}
    for key in db.data:
        out.setdefault(key_slot(key), set()).add(key)
    return out


def index(db: Keyspace) -> dict:
    return {slot: set(keys) for slot, keys in db.slot_keys.items()}


key = st.sampled_from(KEYS)
op = st.one_of(
    key.map(lambda k: [b"RPUSH", k, b"v"]),
    key.map(lambda k: [b"SET", k, b"v"]),
    st.tuples(key, st.integers(1, 99)).map(lambda t: [b"XADD", t[0], b"%d-1" % t[1], b"f", b"v"]),
    key.map(lambda k: [b"XADD", k, b"NOMKSTREAM", b"*", b"f", b"v"]),
    key.map(lambda k: [b"XGROUP", b"CREATE", k, b"g", b"$", b"MKSTREAM"]),
    st.lists(key, min_size=1, max_size=3).map(lambda ks: [b"DEL", *ks]),
    st.tuples(key, key).map(lambda t: [b"RENAME", *t]),
    st.tuples(key, key).map(lambda t: [b"RENAMENX", *t]),
    st.tuples(key, key).map(lambda t: [b"LMOVE", *t, b"LEFT", b"RIGHT"]),
    key.map(lambda k: [b"LPOP", k]),
    key.map(lambda k: [b"LTRIM", k, b"1", b"0"]),
    st.just([b"FLUSHALL"]),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(op, max_size=30))
def test_slot_index_follows_every_key_change(ops):
    db = Keyspace()
    for argv in ops:
        try:
            execute(db, argv, 1000)
        except EngineError:
            pass
        assert index(db) == derived(db), argv
        for slot, keys in derived(db).items():
            assert db.count_keys_in_slot(slot) == len(keys)
    loaded = load_keyspace(dump_keyspace(db))
    assert index(loaded) == derived(loaded) == derived(db)


def test_keys_in_slot_newest_first_and_bounded():
    db = Keyspace()
    for k in (b"{a}1", b"{a}2", b"{a}3"):
        execute(db, [b"SET", k, b"v"], 0)
    execute(db, [b"SET", b"{a}1", b"w"], 0)              # an overwrite keeps its place
    slot = key_slot(b"a")
    assert db.keys_in_slot(slot, 10) == [b"{a}3", b"{a}2", b"{a}1"]
    assert db.keys_in_slot(slot, 2) == [b"{a}3", b"{a}2"]
    assert db.keys_in_slot(slot, 0) == [] and db.keys_in_slot(key_slot(b"b"), 5) == []
    execute(db, [b"RENAME", b"{a}1", b"{a}4"], 0)        # a renamed key is new: first
    assert db.keys_in_slot(slot, 10) == [b"{a}4", b"{a}3", b"{a}2"]


def test_slot_reads_are_internal():
    """The server's reads (engine/cmd_slots.py) are no command a client can send."""
    for argv in ([b"xraft-countkeysinslot", b"1"], [b"xraft-getkeysinslot", b"1", b"1"]):
        try:
            lookup(argv)
        except EngineError as e:
            assert e.message.startswith("ERR unknown command")
        else:
            raise AssertionError("client-visible: %r" % argv)
        assert lookup(argv, internal=True).name == argv[0].decode()
