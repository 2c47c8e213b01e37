"""The source's columns, and stream entries turned into Arrow record batches.

    stream string, id string, ms long, seq long,
    fields map<string,string>   (map<binary,binary> with option binary=true),
    slot int

A partition yields pyarrow RecordBatches (one per page read), not Python
tuples: Spark takes them as they are, without a per-row conversion in the
Python worker. A field name repeated in one entry keeps its last value (a map
has one value per key; XADD keeps both). In string mode names and values must
be UTF-8: an entry that is not fails the task with NotUtf8Error naming it
(read it with binary=true instead of a silent replacement character).
"""
import pyarrow as pa

from xraft.client.errors import XRaftError

SCHEMA_STRING = "stream string, id string, ms long, seq long, fields map<string,string>, slot int"
SCHEMA_BINARY = "stream string, id string, ms long, seq long, fields map<binary,binary>, slot int"


class NotUtf8Error(XRaftError):
    """An entry's field name or value is not UTF-8 (read with binary=true)."""


def arrow_schema(binary: bool) -> pa.Schema:
    kind = pa.binary() if binary else pa.string()
    return pa.schema([("stream", pa.string()), ("id", pa.string()), ("ms", pa.int64()), ("seq", pa.int64()),
                      ("fields", pa.map_(kind, kind)), ("slot", pa.int32())])


def _text_fields(stream: str, entry) -> list:
    try:
        return list({k.decode(): v.decode() for k, v in entry.fields}.items())
    except UnicodeDecodeError:
        raise NotUtf8Error(f"stream {stream!r} entry {entry.id}: a field is not UTF-8; "
                           "read it with option binary=true") from None


def to_batch(stream: str, slot: int, entries, schema: pa.Schema, binary: bool) -> pa.RecordBatch:
    """One Arrow batch of `entries` (StreamEntry) of `stream`."""
    n = len(entries)
    ids = [e.id for e in entries]
    if binary:
        fields = [list(dict(e.fields).items()) for e in entries]
    else:
        fields = [_text_fields(stream, e) for e in entries]
    # ms and seq are uint64 in redis; Spark's long is signed: IDs above 2^63-1 do not occur in practice
    # (ms is a clock), and Arrow raises OverflowError rather than wrapping if one does.
    return pa.RecordBatch.from_arrays([
        pa.array([stream] * n, pa.string()),
        pa.array([f"{i.ms}-{i.seq}" for i in ids], pa.string()),
        pa.array([i.ms for i in ids], pa.int64()),
        pa.array([i.seq for i in ids], pa.int64()),
        pa.array(fields, schema.field("fields").type),
        pa.array([slot] * n, pa.int32()),
    ], schema=schema)
