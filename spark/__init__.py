"""xraft.spark: a PySpark (4.x Python Data Source API) source and exactly-once sink for xraft streams.

    from xraft.spark import XraftDataSource
    spark.dataSource.register(XraftDataSource)
    df = spark.read.format("xraft").option("seeds", "h1:7100").option("streams", "sensors:*").load()

Installed with the extra `xraft[spark]` (pyspark, pyarrow). It talks to the
cluster through the SDK (xraft.client) and never the other way round: the node
and the SDK do not import this package (import-linter contract in pyproject).
The options, the columns and the exactly-once contracts are in source.py.
"""
from .source import XraftDataSource

__all__ = ["XraftDataSource"]
