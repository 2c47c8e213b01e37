"""Which seeds a test runs (XRAFT_SIM_SEED=<one> or XRAFT_SIM_SEEDS=<how many>) and how long (XRAFT_SIM_STEPS)."""
from __future__ import annotations

import os


def selected_seeds(default_count: int, base: int) -> list[int]:
    """One seed if XRAFT_SIM_SEED is set; else XRAFT_SIM_SEEDS (or default_count) seeds from base."""
    one = os.environ.get("XRAFT_SIM_SEED")
    if one:
        return [int(one)]
    count = int(os.environ.get("XRAFT_SIM_SEEDS", default_count))
    return list(range(base, base + count))


def selected_steps(default: int) -> int:
    """Steps per seed: XRAFT_SIM_STEPS (printed in every reproduction command) or the default."""
    return int(os.environ.get("XRAFT_SIM_STEPS", default))
