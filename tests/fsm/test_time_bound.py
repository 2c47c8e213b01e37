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
