"""The compiled kernels (setup.py KERNELS) loaded directly, whatever XRAFT_PURE says:
these tests compare them with their pure twins, so both must be importable."""
import importlib
import os

import pytest


def load_compiled(name: str):
    """The compiled module `name`. Missing is a failure (the build must ship it), unless
    the build was told to skip it (XRAFT_NO_CEXT=1), where there is nothing to compare."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if os.environ.get("XRAFT_NO_CEXT", "") not in ("", "0"):
            pytest.skip("XRAFT_NO_CEXT: no compiled kernels to compare")
        pytest.fail(f"compiled kernel {name} is not built ({e}): run `pip install -e .` with a C compiler")
