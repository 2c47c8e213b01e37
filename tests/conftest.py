import os

# As node_main does before grpc is imported: in-process groups fork snapshot children here too.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

import pytest  # noqa: E402

from tests.redis_oracle import RedisOracle, redis_server_path


@pytest.fixture(scope="session")
def redis_oracle():
    """One redis-server 7.0 per test process (per xdist worker), flushed per test by users."""
    if redis_server_path() is None:
        pytest.fail("redis-server is not installed: run ./dev test (it installs it)")
    oracle = RedisOracle()
    yield oracle
    oracle.close()


@pytest.fixture
def redis(redis_oracle):
    redis_oracle.flush()
    return redis_oracle


def pytest_collection_modifyitems(config, items):
    # Soaks run only when asked for with -m soak.
    if "soak" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="soak: run with -m soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    # Which kernels this run tests: compiled (the default install) or pure (XRAFT_PURE=1).
    from xraft.node import accel
    from xraft.node.engine import listpack  # noqa: F401  (asks for its compiled twin)
    from xraft.node.fsm import entry  # noqa: F401
    return f"xraft kernels: {accel.mode()}"
