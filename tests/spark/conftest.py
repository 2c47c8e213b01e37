"""A real local Spark session (local[2], one per module) and a real sharded xraft cluster.

Spark runs executors' Python workers with PYSPARK_PYTHON (this interpreter:
the venv that has xraft) and binds to SPARK_LOCAL_IP; ./dev sets both, and
they are defaulted here so `pytest tests/spark` works on its own.
"""
import os
import shutil
import sys

import pytest

from tests.cluster.conftest import cluster_factory  # noqa: F401 - the fixture, for this package's tests

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

GROUPS = 3


def have_java() -> bool:
    return shutil.which("java") is not None


@pytest.fixture(scope="module")
def spark():
    if not have_java():
        pytest.fail("java is missing: ./dev installs openjdk-17-jre-headless")
    from pyspark.sql import SparkSession

    from xraft.spark import XraftDataSource
    session = (SparkSession.builder.master("local[2]").appName("xraft-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.memory", "768m")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(XraftDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def xcluster(cluster_factory):  # noqa: F811 - the imported fixture
    """3 nodes, --groups 3: streams land in different Raft groups."""
    c = cluster_factory(3)
    for node in c.nodes.values():
        node.extra_args = ["--groups", str(GROUPS)]
    c.start()          # leaders are elected meanwhile: the SDK waits for them (timeout)
    return c


def seeds(cluster) -> str:
    return ",".join(n.grpc for n in cluster.nodes.values())


def sdk(cluster):
    from xraft.client import sync
    return sync.Client([n.grpc for n in cluster.nodes.values()], timeout=30)
