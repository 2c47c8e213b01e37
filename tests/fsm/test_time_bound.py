"""resolve.TimeStamper: stamps never run backwards, and a wall clock that jumps ahead
moves them only as fast as the node's monotonic clock (plus MAX_CLOCK_LEAD_MS)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from xraft.node.fsm.resolve import MAX_CLOCK_LEAD_MS, TimeStamper

T0 = 1_700_000_000_000
HOUR = 3_600_000


def test_a_wall_clock_jump_ahead_is_held_to_the_monotonic_clock():
    s = TimeStamper()
    s.anchor(T0, 50)                                   # wall T0 at monotonic 50
    assert s.stamp(T0 + 10, 60) == T0 + 10             # in step: the wall clock
    assert s.stamp(T0 + HOUR, 70) == T0 + 20 + MAX_CLOCK_LEAD_MS        # jumped: held
    assert s.stamp(T0 + HOUR + 5_000, 5_070) == T0 + 5_020 + MAX_CLOCK_LEAD_MS
    assert s.clamped == 2
    assert s.clock(T0 + HOUR, 5_070) == T0 + 5_020 + MAX_CLOCK_LEAD_MS  # reads see it too
    # The wall clock is stepped back to the truth: trusted again, and the stamp
    # stays at the floor rather than run backwards.
    assert s.stamp(T0 + 5_030, 5_080) == T0 + 5_030 + MAX_CLOCK_LEAD_MS - 10


def test_small_steps_and_drift_are_followed():
    s = TimeStamper()
    s.anchor(T0, 0)
    t = T0
    for i in range(1, 100):                            # 0.5 s ahead of monotonic every time
        t += 1_500
        assert s.stamp(t, i * 1_000) == t
    assert s.clamped == 0


def test_another_leaders_later_records_raise_the_bound_ours_do_not():
    s = TimeStamper()
    s.anchor(T0, 0)
    s.observe(T0 + 60_000, 10)                         # the group's clock is a minute ahead of ours
    assert s.stamp(T0 + 60_000, 20) == T0 + 60_000     # so a step of our clock to it is followed
    own = s.stamp(T0 + HOUR, 30)                       # our clock jumps: held
    assert own == T0 + 60_020 + MAX_CLOCK_LEAD_MS
    s.observe(own, 40)                                 # our own record, applied: adds no trust
    assert s.stamp(T0 + HOUR, 50) == T0 + 60_040 + MAX_CLOCK_LEAD_MS
    s.observe(T0 - HOUR, 60)                           # an old record (log replay): nothing changes
    assert s.stamp(T0 + HOUR, 70) == T0 + 60_060 + MAX_CLOCK_LEAD_MS


def test_without_a_monotonic_clock_or_an_anchor_the_wall_clock_is_taken():
    s = TimeStamper()
    assert s.stamp(T0 + HOUR) == T0 + HOUR
    s = TimeStamper()
    assert s.stamp(T0 + HOUR, 5) == T0 + HOUR          # no anchor: nothing to compare with


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-HOUR, HOUR), st.integers(0, 5_000), st.booleans()), max_size=50))
def test_stamps_never_decrease_and_never_outrun_the_bound(steps):
    s = TimeStamper()
    s.anchor(T0, 0)
    mono, last = 0, 0
    for skew, dt, is_observe in steps:
        mono += dt
        wall = T0 + mono + skew
        if is_observe:
            s.observe(wall, mono)
            continue
        got = s.stamp(wall, mono)
        assert got >= last
        assert got <= max(last, s.limit(mono))
        last = got


# ISSUE9 C6: a node that STARTS with its clock ahead is trusted by anchor(); the group's clocks
# (peer handshake readings, as skews: peer clock minus ours) outvote it.

def test_a_node_that_started_an_hour_ahead_is_held_to_the_groups_clocks():
    s = TimeStamper()
    s.anchor(T0 + HOUR, 0)                             # our clock reads an hour ahead from the start
    assert s.stamp(T0 + HOUR, 10) == T0 + HOUR         # main: trusted for good
    assert s.cap_by_group([-HOUR, -HOUR + 3], T0 + HOUR + 20, 20)     # both peers: an hour behind us
    assert s.floor_ms == T0 + HOUR                     # the floor never goes down ...
    assert s.stamp(T0 + HOUR + 30, 30) == T0 + HOUR    # ... so time stands still at it
    s2 = TimeStamper()                                 # the same node, capped before its first stamp
    s2.anchor(T0 + HOUR, 0)
    s2.cap_by_group([-HOUR, -HOUR - 7], T0 + HOUR + 20, 20)
    for mono in (30, 1_000, 60_000):
        got = s2.stamp(T0 + HOUR + mono, mono)         # its wall clock still runs an hour ahead
        assert T0 + mono <= got <= T0 + mono + MAX_CLOCK_LEAD_MS       # main: T0 + HOUR + mono
        assert s2.clock(T0 + HOUR + mono, mono) <= T0 + mono + MAX_CLOCK_LEAD_MS   # reads too
    assert s2.capped == 1 and s2.clamped == 3
    # A second reading that agrees changes nothing (the cap is not applied again).
    assert not s2.cap_by_group([-HOUR, -HOUR], T0 + HOUR + 70_000, 70_000)


def test_one_skewed_peer_is_outvoted_ahead_or_behind():
    for skew in (-HOUR, HOUR, -T0):
        s = TimeStamper()
        s.anchor(T0, 0)
        assert not s.cap_by_group([skew, 5], T0 + 10, 10)      # the other peer agrees with us
        assert s.stamp(T0 + 20, 20) == T0 + 20 and s.capped == 0
    # Two clocks cannot outvote each other: with one peer, nothing is capped.
    s = TimeStamper()
    s.anchor(T0 + HOUR, 0)
    assert not s.cap_by_group([-HOUR], T0 + HOUR, 0)
    assert not s.cap_by_group([], T0 + HOUR, 0)                # no readings: no group
    assert s.stamp(T0 + HOUR + 5, 5) == T0 + HOUR + 5


def test_a_skew_within_the_lead_is_not_capped_and_a_trusted_record_ahead_is():
    s = TimeStamper()
    s.anchor(T0, 0)
    assert not s.cap_by_group([-MAX_CLOCK_LEAD_MS, -MAX_CLOCK_LEAD_MS], T0, 0)   # drift: allowed
    s.observe(T0 + HOUR, 10)            # a predecessor an hour ahead: trusted from its record
    assert s.cap_by_group([0, 0], T0 + 20, 20)      # but the group (us included) agrees on T0
    assert s.stamp(T0 + HOUR + 30, 30) == T0 + HOUR     # floor: its record's time; no further race
    assert s.limit(40) == T0 + 40 + MAX_CLOCK_LEAD_MS


@settings(max_examples=300, deadline=None)
@given(st.integers(-HOUR, HOUR), st.lists(st.integers(-2 * HOUR, 2 * HOUR), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(-HOUR, HOUR), st.integers(0, 5_000)), max_size=30),
       st.lists(st.integers(0, 5_000), max_size=30))
def test_after_a_cap_stamps_never_decrease_nor_outrun_the_groups_clock(own_skew, peers, before, after):
    """Our clock reads real time + own_skew (and wanders by `before` jumps until the cap);
    peer p's reads real time + p. After the cap, stamps never decrease, and never pass the
    group's clock (the strict-majority median) + the lead, or the floor reached before."""
    s = TimeStamper()
    s.anchor(T0 + own_skew, 0)
    mono, last = 0, 0
    for jump, dt in before:
        mono += dt
        got = s.stamp(T0 + own_skew + mono + jump, mono)
        assert got >= last
        last = got
    floor = s.floor_ms
    s.cap_by_group([p - own_skew for p in peers], T0 + own_skew + mono, mono)
    assert s.floor_ms == floor
    votes = sorted(peers + [own_skew])
    group = T0 + votes[len(votes) // 2]                # the group's (wall - monotonic)
    # Outvoted (our clock ahead of the group's by more than the lead): held to the group's.
    # Otherwise our own clock, within the lead of the group's, may still be followed.
    lead = MAX_CLOCK_LEAD_MS if own_skew - votes[len(votes) // 2] > MAX_CLOCK_LEAD_MS else 2 * MAX_CLOCK_LEAD_MS
    for dt in after:
        mono += dt
        got = s.stamp(T0 + own_skew + mono, mono)
        assert last <= got <= max(floor, group + mono + lead)
        last = got
