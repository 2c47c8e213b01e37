"""The options of the xraft data source, parsed and validated once on the driver.

Spark hands options over as a case-insensitive mapping of strings; every
option is read here, so a typo in a value fails the query at planning time
with an OptionError naming the option, not later inside a task.
"""
import re
from dataclasses import dataclass

from xraft.client.types import MAX_U64, StreamID

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_PAGE = 1000                  # entries per XRANGE / XREADGROUP call
MAX_PAGE = 100_000
DEFAULT_ENTRIES_PER_PARTITION = 50_000
DEFAULT_GROUP_BATCH = 10_000         # group mode: entries taken per stream and trigger without maxEntriesPerTrigger
DEFAULT_WRITE_CHUNK = 500            # sink: entries per atomic write (one MULTI)
MAX_WRITE_CHUNK = 10_000
MAX_STREAMS = 100_000                # streams one query may read (a pattern matching more is an error)
MAX_DELIVERIES = (1 << 63) - 1       # XRAFT.GROUPCFG's MAXDELIVERIES range
STREAM_PLACEHOLDER = "<stream>"      # in deadLetterStream: replaced by the source stream's name
_GLOB = re.compile(r"[*?\[]")


class OptionError(ValueError):
    """An option is missing or has a value the source cannot use; `option` names it."""

    def __init__(self, option: str, problem: str):
        super().__init__(f"xraft option {option!r}: {problem}")
        self.option = option
        self.problem = problem


def _get(options, name: str, default=None):
    # Spark lower-cases option names (CaseInsensitiveDict); a plain dict may not.
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    return default


def _int(options, name: str, default, lo: int, hi: int):
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise OptionError(name, f"not an integer: {raw!r}") from None
    if not lo <= value <= hi:
        raise OptionError(name, f"{value} is outside {lo}..{hi}")
    return value


def flag(options, name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(name, f"not a boolean: {raw!r}")


def _list(raw) -> list:
    return [p.strip() for p in str(raw or "").split(",") if p.strip()]


@dataclass(frozen=True)
class Conn:
    """How to reach the cluster (picklable: it travels to the executors)."""
    seeds: tuple
    token: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    follower_reads: bool = False

    @classmethod
    def parse(cls, options) -> "Conn":
        seeds = tuple(_list(_get(options, "seeds")))
        if not seeds:
            raise OptionError("seeds", "required: comma-separated gRPC addresses host:port")
        for s in seeds:
            if ":" not in s:
                raise OptionError("seeds", f"{s!r} is not host:port")
        try:
            timeout = float(_get(options, "timeout", DEFAULT_TIMEOUT_S))
        except ValueError:
            raise OptionError("timeout", "not a number of seconds") from None
        if not 0 < timeout <= 3600:
            raise OptionError("timeout", f"{timeout} is outside (0, 3600] seconds")
        return cls(seeds, _get(options, "token"), timeout, flag(options, "followerReads", False))


def lower_bound(text: str) -> StreamID:
    """The smallest ID an XRANGE start bound admits: "-", "5" (5-0), "5-1", "(5-1" (exclusive)."""
    text = text.strip()
    if text == "-":
        return StreamID(0, 0)
    if text.startswith("("):
        sid = StreamID.parse(text[1:])
        if sid.seq < MAX_U64:
            return StreamID(sid.ms, sid.seq + 1)
        return StreamID(sid.ms + 1, 0)
    return StreamID.parse(text)


def upper_bound(text: str) -> StreamID:
    """The largest ID an XRANGE end bound admits: "+", "5" (5-max), "5-1", "(5-1" (exclusive)."""
    text = text.strip()
    if text == "+":
        return StreamID(MAX_U64, MAX_U64)
    if text.startswith("("):
        sid = StreamID.parse(text[1:])
        if sid.seq > 0:
            return StreamID(sid.ms, sid.seq - 1)
        return StreamID(sid.ms - 1, MAX_U64)
    if "-" not in text:
        return StreamID(StreamID.parse(text).ms, MAX_U64)
    return StreamID.parse(text)


@dataclass(frozen=True)
class ReadOptions:
    conn: Conn
    names: tuple                      # stream names given literally
    patterns: tuple                   # glob patterns (SCAN MATCH)
    start: StreamID                   # batch: first ID read; streaming: see `from_latest`
    end: StreamID                     # batch: last ID read
    from_latest: bool                 # streaming: begin after the streams' current last entries
    binary: bool                      # fields as map<binary,binary> instead of map<string,string>
    page: int
    entries_per_partition: int
    max_per_trigger: int | None
    group: str | None
    consumer: str | None
    claim_min_idle_ms: int
    max_deliveries: int | None = None  # group mode: the group's XRAFT.GROUPCFG MAXDELIVERIES
    dead_letter: str | None = None     # group mode: dead-letter stream (STREAM_PLACEHOLDER: per stream)

    def dead_letter_key(self, stream: str) -> str:
        return self.dead_letter.replace(STREAM_PLACEHOLDER, stream)

    @classmethod
    def parse(cls, options) -> "ReadOptions":
        conn = Conn.parse(options)
        given = _list(_get(options, "streams")) or _list(_get(options, "stream"))
        if not given:
            raise OptionError("streams", "required: comma-separated stream names or glob patterns")
        names = tuple(s for s in given if not _GLOB.search(s))
        patterns = tuple(s for s in given if _GLOB.search(s))
        start_text = str(_get(options, "start", "-"))
        from_latest = start_text.strip() in ("$", "latest")
        try:
            start = StreamID(0, 0) if from_latest or start_text.strip() == "earliest" else lower_bound(start_text)
        except ValueError as e:
            raise OptionError("start", f"not a stream ID or bound: {start_text!r} ({e})") from None
        end_text = str(_get(options, "end", "+"))
        try:
            end = upper_bound(end_text)
        except ValueError as e:
            raise OptionError("end", f"not a stream ID or bound: {end_text!r} ({e})") from None
        group, consumer = _get(options, "group"), _get(options, "consumer")
        if (group is None) != (consumer is None):
            raise OptionError("consumer" if group else "group", "group and consumer go together")
        max_per_trigger = _int(options, "maxEntriesPerTrigger", None, 1, 1 << 40)
        # The driver's XREADGROUP > counts one delivery and each task read of the batch one
        # more, so fewer than 2 would dead-letter every entry before Spark processed it once.
        max_deliveries = _int(options, "maxDeliveries", None, 2, MAX_DELIVERIES)
        dead_letter = _get(options, "deadLetterStream")
        if (max_deliveries is None) != (dead_letter is None):
            raise OptionError("deadLetterStream" if max_deliveries else "maxDeliveries",
                              "maxDeliveries and deadLetterStream go together")
        if max_deliveries is not None and group is None:
            raise OptionError("maxDeliveries", "needs consumer-group mode (options group and consumer)")
        return cls(conn, names, patterns, start, end, from_latest, flag(options, "binary", False),
                   _int(options, "pageSize", DEFAULT_PAGE, 1, MAX_PAGE),
                   _int(options, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION, 1, 1 << 40),
                   max_per_trigger, group, consumer, _int(options, "claimMinIdleMs", 0, 0, 1 << 40),
                   max_deliveries, None if dead_letter is None else str(dead_letter))


@dataclass(frozen=True)
class WriteOptions:
    conn: Conn
    stream: str
    fields: tuple | None              # columns written as fields (None: every column)
    chunk: int
    maxlen: int | None
    password: str | None              # the nodes' RESP --requirepass (the sink's transactions go over RESP)

    @classmethod
    def parse(cls, options) -> "WriteOptions":
        conn = Conn.parse(options)
        stream = _get(options, "stream")
        if not stream:
            raise OptionError("stream", "required: the stream the rows are added to")
        fields = tuple(_list(_get(options, "fields"))) or None
        return cls(conn, str(stream), fields, _int(options, "chunkSize", DEFAULT_WRITE_CHUNK, 1, MAX_WRITE_CHUNK),
                   _int(options, "maxlen", None, 1, 1 << 62), _get(options, "password"))
