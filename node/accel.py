"""Which implementation of the hot kernels runs: compiled (Cython, built by
`pip install`) or the pure-Python reference.

A few pure modules (engine/listpack.py, fsm/entry.py) end by asking
`compiled(name)` for a compiled twin of some of their functions and, if one
is there, use it in place of their own. The pure functions stay the
reference: tests/kernels check compiled == pure on random (and malformed)
inputs, and `XRAFT_PURE=1` in the environment forces the pure code
everywhere (read once, at import).

This module lives beside invariant.py, outside the pure layers, because it
reads the environment; the engine and the fsm only receive its answer.
"""
import importlib
import os

PURE = os.environ.get("XRAFT_PURE", "") not in ("", "0")

# name -> the compiled module that was loaded, or the reason it was not (str).
STATUS: dict = {}


def compiled(name: str):
    """The compiled module `name`, or None (XRAFT_PURE set, or not built: an
    install without a C compiler, or the source tree without `pip install`)."""
    if PURE:
        STATUS[name] = "XRAFT_PURE is set"
        return None
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        STATUS[name] = "not built (%s)" % e
        return None
    STATUS[name] = module
    return module


def mode() -> str:
    """"compiled" if every kernel module asked for so far was loaded, else "pure"
    (or "mixed"): for logs, benchmarks and the test run's header."""
    loaded = [not isinstance(v, str) for v in STATUS.values()]
    if loaded and all(loaded):
        return "compiled"
    return "mixed" if any(loaded) else "pure"
