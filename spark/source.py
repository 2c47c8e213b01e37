"""XraftDataSource: the "xraft" format for spark.read / readStream / write / writeStream.

Options (names are case-insensitive, as everywhere in Spark):

  connection    seeds (required: gRPC host:port list), token, timeout (seconds a call
                may keep retrying through failovers, default 30), followerReads
  reading       streams (names and glob patterns, comma-separated; a pattern is
                resolved by SCAN MATCH on every Raft group), start, end (XRANGE
                bounds: "-", "+", "ms", "ms-seq", "(ms-seq"; streaming start may be
                "latest"), binary (fields as map<binary,binary>), pageSize,
                entriesPerPartition (batch), maxEntriesPerTrigger (streaming),
                group + consumer (streaming consumer-group mode), claimMinIdleMs
                maxDeliveries + deadLetterStream (group mode: the group's XRAFT.GROUPCFG
                dead-letter policy; "<stream>" in the key is the source stream's name)
  writing       stream (required), fields (columns to write; default all), chunkSize
                (entries per atomic write), maxlen (XADD MAXLEN ~), password (the nodes'
                RESP --requirepass: the sink's transactions go over RESP)

Columns read: stream, id, ms, seq, fields, slot (rows.py). Rows written: each
chosen column becomes one XADD field (a map column gives its entries; nulls
are left out); see sink.py for the exactly-once contract.
"""
from pyspark.sql.datasource import DataSource

from .batch_read import BatchReader
from .options import ReadOptions, WriteOptions, flag
from .rows import SCHEMA_BINARY, SCHEMA_STRING
from .sink import BatchWriter, StreamWriter
from .stream_read import StreamReader


class XraftDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "xraft"

    def schema(self):
        return SCHEMA_BINARY if flag(self.options, "binary", False) else SCHEMA_STRING

    def reader(self, schema):
        return BatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema):
        return StreamReader(ReadOptions.parse(self.options))

    def writer(self, schema, overwrite):
        return BatchWriter(WriteOptions.parse(self.options), schema.fieldNames())

    def streamWriter(self, schema, overwrite):
        return StreamWriter(WriteOptions.parse(self.options), schema.fieldNames())
