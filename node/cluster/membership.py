"""Membership: which replicas each Raft group should have, and the next Raft conf change
that takes a group's configuration there. Pure: the node side (server/membership.py)
reads a group's configuration on its leader and proposes what next_conf_step says.

    wanted_members(map, group)        a data group: the map's voters and learners, as Raft ids (the
                                      replica ids of slot_map.py: a rejoined node's is new)
    meta_members_wanted(map, v, l)    group 0 (not in the map): keep its UP voters, top them
                                      up to META_VOTERS from the UP nodes (learners first),
                                      every other node that is not REMOVED a learner
    next_conf_step(conf, wanted, caught_up)
                                      one step, or None when the configuration is the wanted one

The steps keep the group safe (docs/sharding.md, "Membership"):
  * a replica the group lacks joins as a learner first, by a simple change (one at a time):
    it is caught up by the leader's snapshot before it counts for any quorum;
  * promotions (only of learners the leader reports caught up), voter removals and demotions
    go in ONE joint change (enter joint, auto leave): during the joint phase both the old and
    the new voter sets must agree, so the group never depends on a quorum of the new set
    before that set has the log;
  * a promotion that waits for a learner to catch up holds back the removals planned with it
    (a replacement never shrinks the group first);
  * learners that are not wanted leave one at a time (simple changes);
  * a joint configuration is left first (auto leave does it; WAIT says so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .meta_machine import META_VOTERS
from .slot_map import NodeState, SlotMap

CATCH_UP_ENTRIES = 100     # a learner this close to the leader's last index may be promoted

ADD_LEARNER, PROMOTE, REMOVE, DEMOTE, LEAVE_JOINT, WAIT = (
    "add_learner", "promote", "remove", "demote", "leave_joint", "wait")


@dataclass(frozen=True)
class Conf:
    """A group's Raft configuration (as its leader applied it)."""
    voters: tuple
    learners: tuple = ()
    voters_outgoing: tuple = ()     # non-empty while joint
    auto_leave: bool = True

    @property
    def joint(self) -> bool:
        return bool(self.voters_outgoing)

    @property
    def members(self) -> frozenset:
        return frozenset(self.voters) | frozenset(self.learners) | frozenset(self.voters_outgoing)


@dataclass(frozen=True)
class ConfStep:
    """joint=False: one simple change; joint=True: all `changes` in one joint change.
    changes: ((kind, node), ...) with kind ADD_LEARNER / PROMOTE / REMOVE / DEMOTE;
    kind LEAVE_JOINT or WAIT (nothing to propose now: `why`) with no changes."""
    kind: str
    changes: tuple = ()
    joint: bool = False
    why: str = ""


def wanted_members(slot_map: SlotMap, group_id: int) -> tuple:
    """(voters, learners) of a data group as replica ids: what its Raft configuration must hold."""
    spec = slot_map.groups[group_id]
    return tuple(spec.replica_id(n) for n in spec.voters), tuple(spec.replica_id(n) for n in spec.learners)


def meta_members_wanted(slot_map: SlotMap, voters: tuple, learners: tuple) -> tuple:
    """(voters, learners) group 0 should have, given its current Raft voters and learners."""
    up = sorted(n for n, s in slot_map.nodes.items() if s.state is NodeState.UP)
    live = {n for n, s in slot_map.nodes.items() if s.state is not NodeState.REMOVED}
    keep = [v for v in sorted(voters) if v in up]
    # Learners already hold (most of) the log: they are promoted before nodes group 0 lacks.
    spare = [n for n in up if n not in keep and n in learners] + \
            [n for n in up if n not in keep and n not in learners]
    while len(keep) < META_VOTERS and spare:
        keep.append(spare.pop(0))
    if not keep:            # no UP node at all: change nothing rather than lose the group
        return tuple(sorted(voters)), tuple(sorted(learners))
    return tuple(sorted(keep)), tuple(sorted(live - set(keep)))


def next_conf_step(conf: Conf, voters: tuple, learners: tuple, caught_up=frozenset()) -> Optional[ConfStep]:
    """The next step from `conf` toward (voters, learners); None when there. `caught_up`: the
    learners the leader reports close enough to its log to be promoted."""
    want_v, want_l = set(voters), set(learners)
    if not want_v:
        raise ValueError("a group needs at least one voter")
    if conf.joint:
        return ConfStep(WAIT, why="the group is leaving a joint configuration") if conf.auto_leave \
            else ConfStep(LEAVE_JOINT)
    cur_v, cur_l = set(conf.voters), set(conf.learners)
    missing = sorted((want_v | want_l) - cur_v - cur_l)
    if missing:
        return ConfStep(ADD_LEARNER, ((ADD_LEARNER, missing[0]),))
    promote = sorted(want_v & cur_l)
    not_ready = [n for n in promote if n not in caught_up]
    if not_ready:
        return ConfStep(WAIT, why="learner(s) %s are catching up" % ",".join(map(str, not_ready)))
    changes = [(PROMOTE, n) for n in promote]
    changes += [(REMOVE, n) for n in sorted(cur_v - want_v - want_l)]
    changes += [(DEMOTE, n) for n in sorted(cur_v & want_l)]
    if changes:
        return ConfStep("joint", tuple(changes), joint=True)
    extra = sorted(cur_l - want_v - want_l)
    if extra:
        return ConfStep(REMOVE, ((REMOVE, extra[0]),))
    return None
