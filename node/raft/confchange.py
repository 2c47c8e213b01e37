"""Membership changes: produce the next TrackerConfig + Progress map (etcd confchange).

Three operations (thesis §4):
  simple(changes)      — at most one voter added/removed (§4.1 single-server change)
  enter_joint(auto, c) — C_old,new: outgoing = current voters, incoming = changed (§4.3)
  leave_joint()        — drop the outgoing half; learners_next become learners
All work on copies; the caller installs the result (switch_to_config) only on
success. IDs that leave the configuration are recorded in `removed` and a
later attempt to add them raises ConfChangeError (IDs are never reused).
"""
from __future__ import annotations

from .codec import MAX_NODES, MAX_REMOVED
from .progress import Progress
from .quorum import JointConfig
from .tracker import ProgressTracker, TrackerConfig
from .types import ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfChangeError, ConfState


def _members(cfg: TrackerConfig) -> frozenset[int]:
    return cfg.voters.ids() | cfg.learners | cfg.learners_next


class Changer:
    def __init__(self, tracker: ProgressTracker, last_index: int) -> None:
        self.tracker = tracker
        self.last_index = last_index  # new peers start probing at max(last_index, 1)

    # ------------------------------------------------ operations

    def enter_joint(self, auto_leave: bool, changes) -> tuple[TrackerConfig, dict[int, Progress]]:
        cfg, prs = self._copy()
        if cfg.joint():
            raise ConfChangeError("config is already joint")
        if not cfg.voters.incoming:
            raise ConfChangeError("can't make a zero-voter config joint")
        cfg.voters = JointConfig(cfg.voters.incoming, cfg.voters.incoming)
        self._apply(cfg, prs, changes)
        cfg.auto_leave = auto_leave
        return self._finish(cfg, prs)

    def leave_joint(self) -> tuple[TrackerConfig, dict[int, Progress]]:
        cfg, prs = self._copy()
        if not cfg.joint():
            raise ConfChangeError("can't leave a non-joint config")
        learners = set(cfg.learners)
        for nid in cfg.learners_next:
            learners.add(nid)
            prs[nid].is_learner = True
        cfg.learners = frozenset(learners)
        cfg.learners_next = frozenset()
        for nid in cfg.voters.outgoing:
            if nid not in cfg.voters.incoming and nid not in cfg.learners:
                del prs[nid]
        cfg.voters = JointConfig(cfg.voters.incoming, frozenset())
        cfg.auto_leave = False
        return self._finish(cfg, prs)

    def simple(self, changes) -> tuple[TrackerConfig, dict[int, Progress]]:
        cfg, prs = self._copy()
        if cfg.joint():
            raise ConfChangeError("can't apply simple config change in joint config")
        self._apply(cfg, prs, changes)
        before = self.tracker.config.voters.incoming
        if len(before ^ cfg.voters.incoming) > 1:
            raise ConfChangeError("more than one voter changed without entering joint config")
        return self._finish(cfg, prs)

    def apply_v2(self, cc: ConfChangeV2) -> tuple[TrackerConfig, dict[int, Progress]]:
        if cc.leave_joint():
            return self.leave_joint()
        joint, auto = cc.enter_joint()
        if joint:
            return self.enter_joint(auto, cc.changes)
        return self.simple(cc.changes)

    # ------------------------------------------------ helpers

    def _copy(self) -> tuple[TrackerConfig, dict[int, Progress]]:
        return self.tracker.config.clone(), {k: v.clone() for k, v in self.tracker.progress.items()}

    def _apply(self, cfg: TrackerConfig, prs: dict[int, Progress], changes) -> None:
        for ch in changes:
            if not isinstance(ch, ConfChangeSingle) or ch.node_id <= 0:
                raise ConfChangeError("malformed change", getattr(ch, "node_id", 0))
            if ch.type == ConfChangeType.ADD_NODE:
                self._make_voter(cfg, prs, ch.node_id)
            elif ch.type == ConfChangeType.ADD_LEARNER_NODE:
                self._make_learner(cfg, prs, ch.node_id)
            elif ch.type == ConfChangeType.REMOVE_NODE:
                self._remove(cfg, prs, ch.node_id)
            elif ch.type != ConfChangeType.UPDATE_NODE:
                raise ConfChangeError(f"unexpected change type {ch.type}", ch.node_id)
        if not cfg.voters.incoming:
            raise ConfChangeError("removed all voters")

    def _check_not_removed(self, cfg: TrackerConfig, nid: int) -> None:
        if nid in cfg.removed:
            raise ConfChangeError("node ID was removed before; IDs are never reused", nid)

    def _make_voter(self, cfg: TrackerConfig, prs: dict[int, Progress], nid: int) -> None:
        self._check_not_removed(cfg, nid)
        pr = prs.get(nid)
        if pr is None:
            self._init_progress(cfg, prs, nid, False)
            return
        pr.is_learner = False
        cfg.learners = cfg.learners - {nid}
        cfg.learners_next = cfg.learners_next - {nid}
        cfg.voters = JointConfig(cfg.voters.incoming | {nid}, cfg.voters.outgoing)

    def _make_learner(self, cfg: TrackerConfig, prs: dict[int, Progress], nid: int) -> None:
        self._check_not_removed(cfg, nid)
        pr = prs.get(nid)
        if pr is None:
            self._init_progress(cfg, prs, nid, True)
            return
        if pr.is_learner:
            return
        self._remove(cfg, prs, nid)
        prs[nid] = pr
        if nid in cfg.voters.outgoing:
            cfg.learners_next = cfg.learners_next | {nid}  # demoted when leaving joint
        else:
            pr.is_learner = True
            cfg.learners = cfg.learners | {nid}

    def _remove(self, cfg: TrackerConfig, prs: dict[int, Progress], nid: int) -> None:
        if nid not in prs:
            return
        cfg.voters = JointConfig(cfg.voters.incoming - {nid}, cfg.voters.outgoing)
        cfg.learners = cfg.learners - {nid}
        cfg.learners_next = cfg.learners_next - {nid}
        if nid not in cfg.voters.outgoing:
            del prs[nid]

    def _init_progress(self, cfg: TrackerConfig, prs: dict[int, Progress], nid: int,
                       learner: bool) -> None:
        if learner:
            cfg.learners = cfg.learners | {nid}
        else:
            cfg.voters = JointConfig(cfg.voters.incoming | {nid}, cfg.voters.outgoing)
        # recent_active: a new peer gets a full election timeout before CheckQuorum counts it dead.
        prs[nid] = Progress(0, max(self.last_index, 1), self.tracker.new_inflights(),
                            is_learner=learner, recent_active=True)

    def _finish(self, cfg: TrackerConfig, prs: dict[int, Progress]) -> tuple[TrackerConfig, dict]:
        gone = _members(self.tracker.config) - _members(cfg)
        if gone:
            cfg.removed = cfg.removed | gone
        if len(cfg.removed) > MAX_REMOVED:
            raise ConfChangeError(f"more than {MAX_REMOVED} removed IDs to remember")
        for ids in (cfg.voters.incoming, cfg.voters.outgoing, cfg.learners, cfg.learners_next):
            if len(ids) > MAX_NODES:
                raise ConfChangeError(f"more than {MAX_NODES} members in one set")
        check_config(cfg, prs)
        return cfg, prs


def check_config(cfg: TrackerConfig, prs: dict[int, Progress]) -> None:
    """Raise ConfChangeError unless cfg/prs satisfy the configuration invariants."""
    for nid in _members(cfg):
        if nid not in prs:
            raise ConfChangeError("no progress for member", nid)
    for nid in prs:
        if nid not in _members(cfg):
            raise ConfChangeError("progress for a non-member", nid)
    for nid in cfg.learners_next:
        if nid not in cfg.voters.outgoing:
            raise ConfChangeError("in learners_next but not an outgoing voter", nid)
        if prs[nid].is_learner:
            raise ConfChangeError("in learners_next but already a learner", nid)
    for nid in cfg.learners:
        if nid in cfg.voters.ids():
            raise ConfChangeError("both learner and voter", nid)
        if not prs[nid].is_learner:
            raise ConfChangeError("in learners but not marked learner", nid)
    for nid in cfg.removed & _members(cfg):
        raise ConfChangeError("removed ID is a member", nid)
    if not cfg.joint() and (cfg.learners_next or cfg.auto_leave):
        raise ConfChangeError("learners_next/auto_leave set outside a joint config")


def restore(tracker: ProgressTracker, last_index: int, cs: ConfState) -> tuple[TrackerConfig, dict]:
    """Build the config described by a ConfState (from storage or a snapshot)."""
    cfg = TrackerConfig()
    cfg.voters = JointConfig(frozenset(cs.voters), frozenset(cs.voters_outgoing))
    cfg.learners = frozenset(cs.learners)
    cfg.learners_next = frozenset(cs.learners_next)
    cfg.auto_leave = bool(cs.auto_leave) and bool(cs.voters_outgoing)
    cfg.removed = frozenset(cs.removed)
    nxt = max(last_index, 1)
    prs = {nid: Progress(0, nxt, tracker.new_inflights(), is_learner=nid in cfg.learners,
                         recent_active=True)
           for nid in _members(cfg)}
    check_config(cfg, prs)
    return cfg, prs
