"""Stream ID arithmetic and the offset JSON of the streaming read."""
from xraft.client.types import MAX_U64, StreamID

ZERO = StreamID(0, 0)


def next_id(sid: StreamID) -> StreamID:
    return StreamID(sid.ms, sid.seq + 1) if sid.seq < MAX_U64 else StreamID(sid.ms + 1, 0)


def prev_id(sid: StreamID) -> StreamID:
    if sid == ZERO:
        return ZERO
    return StreamID(sid.ms, sid.seq - 1) if sid.seq > 0 else StreamID(sid.ms - 1, MAX_U64)


def to_offset(ids: dict) -> dict:
    """{stream: StreamID} -> the offset Spark checkpoints: {stream: "ms-seq"}, sorted by stream."""
    return {s: str(ids[s]) for s in sorted(ids)}


def from_offset(offset: dict) -> dict:
    """An offset from Spark's checkpoint (read back from disk: validated): {stream: StreamID}."""
    if not isinstance(offset, dict):
        raise ValueError(f"xraft offset is not a JSON object: {offset!r}")
    return {str(s): StreamID.parse(i) for s, i in offset.items()}


def shares(total: int, count: int) -> list:
    """`total` split as evenly as possible into `count` parts (the first ones larger)."""
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]
