"""The keyspace: one database of typed values, plus its per-keyspace settings.

    Keyspace
    +-- data:   dict[bytes, value]   value is one of
    |             bytes           a string (SET/GET)
    |             ListValue       (lists.py)
    |             Stream          (stream.py)
    +-- config: EngineConfig       node limits, settable per keyspace (CONFIG SET)
    +-- slot_keys: dict[int, dict[bytes, None]]
    |                              the keys of each cluster slot (slots.py), oldest
    |                              first (CLUSTER GETKEYSINSLOT lists them newest
    |                              first, as redis's per-slot list does); a slot
    |                              with no key has no entry. Derived from `data`,
    |                              never persisted: rebuilt when a dump is loaded
    +-- ready:  set[bytes]         keys that got new data since the last
                                   pop_ready_keys(): the server wakes blocked
                                   clients on them (XREAD BLOCK, BLPOP, ...);
                                   also streams deleted or overwritten (redis
                                   signalDeletedKeyAsReady): a blocked
                                   XREADGROUP must then fail (-UNBLOCKED)
+-- side_writes: list[bytes]       keys written by the running command that its
                                   arguments do not name (dead letters); the fsm
                                   pops them for WATCH

Invariant: slot_keys holds exactly the keys of `data`, each under key_slot(key);
every insertion and removal of a key goes through set/delete/clear (or
rebuild_slot_index after filling `data` directly), so it stays so.
Invariant: no key maps to an empty list (an emptied list is deleted, as in Redis);
an empty stream may exist (XADD NOMKSTREAM / XTRIM / XDEL keep it).
"""
from dataclasses import dataclass, field
from itertools import islice

from .errors import WrongTypeError
from .slots import key_slot


@dataclass
class EngineConfig:
    stream_node_max_bytes: int = 4096     # 0 = no limit (as in redis)
    stream_node_max_entries: int = 100    # 0 = no limit
    list_max_listpack_size: int = -2      # redis's list-max-listpack-size
    list_compress_depth: int = 0


_TYPE_NAMES: dict[type, str] = {bytes: "string"}


def register_type(cls: type, name: str) -> None:
    """Value modules call this so TYPE and lookups know their class."""
    _TYPE_NAMES[cls] = name


@dataclass
class Keyspace:
    data: dict = field(default_factory=dict)
    config: EngineConfig = field(default_factory=EngineConfig)
    ready: set = field(default_factory=set)
    slot_keys: dict = field(default_factory=dict)
    side_writes: list = field(default_factory=list)

    def __post_init__(self):
        if self.data:
            self.rebuild_slot_index()

    def get(self, key: bytes):
        return self.data.get(key)

    def get_typed(self, key: bytes, cls: type):
        """The value at key if it is a `cls`, None if absent; else WRONGTYPE."""
        value = self.data.get(key)
        if value is not None and type(value) is not cls:
            raise WrongTypeError()
        return value

    def set(self, key: bytes, value) -> None:
        old = self.data.get(key)
        self.data[key] = value
        if old is None:
            # A new key: the only case that touches the slot index (an XADD to an
            # existing stream never calls set), so the hash is paid once per key.
            slot = key_slot(key)
            keys = self.slot_keys.get(slot)
            if keys is None:
                self.slot_keys[slot] = {key: None}
            else:
                keys[key] = None
        elif old is not value:
            self._signal_gone(key, old)

    def delete(self, key: bytes) -> bool:
        old = self.data.pop(key, None)
        if old is None:
            return False
        slot = key_slot(key)
        keys = self.slot_keys[slot]
        del keys[key]
        if not keys:
            del self.slot_keys[slot]
        self._signal_gone(key, old)
        return True

    def clear(self) -> None:
        """FLUSHDB/FLUSHALL: every key goes, and every stream is signalled (as
        redis signals each key with blocked clients)."""
        for key, value in self.data.items():
            self._signal_gone(key, value)
        self.data.clear()
        self.slot_keys.clear()

    def rebuild_slot_index(self) -> None:
        """slot_keys from `data` (after a load filled `data` directly), in `data`'s order."""
        self.slot_keys = {}
        for key in self.data:
            self.slot_keys.setdefault(key_slot(key), {})[key] = None

    def count_keys_in_slot(self, slot: int) -> int:
        keys = self.slot_keys.get(slot)
        return len(keys) if keys else 0

    def keys_in_slot(self, slot: int, count: int) -> list:
        """Up to `count` keys of `slot`, the newest first (redis's GETKEYSINSLOT order)."""
        keys = self.slot_keys.get(slot)
        if not keys or count <= 0:
            return []
        return list(islice(reversed(keys), count))

    def _signal_gone(self, key: bytes, old) -> None:
        # Only a stream's waiters care that their key went away: a blocked
        # XREADGROUP is woken with -UNBLOCKED (XREAD re-reads and waits on).
        # A deleted or replaced list wakes no one, as in redis: its waiters
        # only want elements, and every push signals anyway.
        if _TYPE_NAMES.get(type(old)) == "stream":
            self.ready.add(key)

    def exists(self, key: bytes) -> bool:
        return key in self.data

    def type_name(self, key: bytes) -> str:
        value = self.data.get(key)
        if value is None:
            return "none"
        return _TYPE_NAMES[type(value)]

    def signal_ready(self, key: bytes) -> None:
        """A list got elements or a stream got entries: blocked clients may proceed."""
        self.ready.add(key)

    def note_side_write(self, key: bytes) -> None:
        """A command wrote `key` though it does not name it (a dead letter,
        dead_letters.py): the fsm counts it as modified for WATCH."""
        self.side_writes.append(key)

    def pop_side_writes(self) -> list:
        written, self.side_writes = self.side_writes, []
        return written

    def pop_ready_keys(self) -> set:
        ready, self.ready = self.ready, set()
        return ready
