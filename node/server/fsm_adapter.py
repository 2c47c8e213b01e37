"""FsmAdapter: the Raft driver's StateMachine protocol (runtime/driver_api.py) over the
deterministic fsm.StateMachine, for RaftBackend (raft_backend.py)."""
from __future__ import annotations

from typing import Callable, Optional

from ..fsm.entry import Record
from ..fsm.slot_move_apply import PREPARE_MIN_BYTES
from ..fsm.state_machine import StateMachine
from ..invariant import invariant


class FsmAdapter:
    """The driver's StateMachine protocol over fsm.StateMachine.

    Two index spaces meet here. The driver calls apply() only for NORMAL
    entries with data, while fsm.StateMachine wants every index (skip() for
    Raft's empty entries and conf changes): the gap before each apply is
    skipped. Snapshots: the driver snapshots at its own applied index, which
    may be past the fsm's last record (trailing empty entries); restore()
    skips forward to the index the driver names.
    """

    # apply() takes want_results (the driver passes False when no caller waits).
    results_optional = True

    def __init__(self, sm: StateMachine, on_applied: Callable[[frozenset], None],
                 on_time: Optional[Callable[[int], None]] = None):
        self.sm = sm
        self._on_applied = on_applied
        self._on_time = on_time            # the applied time, after every record (TimeStamper.observe)
        # Set by RaftBackend.attach(): the first restore runs in GroupDriver.open's
        # executor thread, where no listener may be called (and none is waiting yet).
        self.on_restored: Optional[Callable[[], None]] = None
        self.applied_as_proposed = 0       # records applied from the leader's object, not decoded

    @property
    def applied_index(self) -> int:
        return self.sm.applied_index

    def apply(self, index: int, data: bytes, want_results: bool = True, record: Optional[Record] = None):
        """`want_results=False`: the driver has no caller waiting for this
        entry; the fsm may leave anonymous requests' results unbuilt. `record`:
        the leader's own proposal, as it encoded `data` from it (not decoded again)."""
        sm = self.sm
        invariant(index > sm.applied_index, "apply %d at or below applied %d" % (index, sm.applied_index))
        while sm.applied_index < index - 1:
            sm.skip(sm.applied_index + 1)
        results = sm.apply(index, data, want_results, record)
        if record is not None:
            self.applied_as_proposed += 1
        if self._on_time is not None and data:
            self._on_time(sm.last_now_ms)
        ready = sm.last_ready_keys
        if ready:
            self._on_applied(ready)
        return results

    # Entries at least this big may have a costly part to run off the loop (prepare()).
    prepare_min_bytes = PREPARE_MIN_BYTES

    def prepare(self, index: int, data: bytes, record: Optional[Record] = None):
        """The driver's hook (raft_driver "Costly applies off the loop"): StateMachine.prepare."""
        return self.sm.prepare(index, data, record)

    def snapshot(self) -> bytes:
        return self.sm.snapshot()

    def prepare_restore(self, data: bytes):
        """The driver's hook for an installed snapshot: its decode, run off the loop
        (raft_driver._persist) and handed to restore()."""
        return self.sm.parse_snapshot(data)

    def restore(self, data: bytes, index: int, prepared=None) -> None:
        sm = self.sm
        sm.restore(data, prepared)
        invariant(sm.applied_index <= index, "snapshot data at %d is past its index %d"
                  % (sm.applied_index, index))
        while sm.applied_index < index:
            sm.skip(sm.applied_index + 1)
        if self.on_restored is not None:
            self.on_restored()
