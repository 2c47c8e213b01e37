"""Logging for xraft-node: quiet by default, structured when asked.

Every record goes to stderr. The default level is WARNING, so a healthy node
prints one line at start ("xraft-node N ready ...") and nothing else until
something needs an operator. Text lines look like

    2024-05-01T12:00:00.123Z WARNING xraft.node node=1 xraft-node 1 ready grpc=... resp=...

and with --log-json each record is one JSON object per line (ts, level,
logger, node, msg, plus exc when there is a traceback), so a log shipper
never has to parse free text. Records may carry extra structured fields
through `extra={"fields": {...}}`; both formats print them.

Only the root handler is configured here; grpc's own C-core logging stays
off unless GRPC_VERBOSITY says otherwise.
"""
from __future__ import annotations

import json
import logging
import sys
import time

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}
MAX_MESSAGE_CHARS = 16_384     # one runaway repr must not produce a megabyte log line


def _iso(created: float) -> str:
    t = time.gmtime(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + ".%03dZ" % int((created % 1) * 1000)


class _Base(logging.Formatter):
    def __init__(self, node_id: int):
        super().__init__()
        self.node_id = node_id

    def _message(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if len(msg) > MAX_MESSAGE_CHARS:
            msg = msg[:MAX_MESSAGE_CHARS] + "...(%d chars)" % len(msg)
        return msg


class TextFormatter(_Base):
    def format(self, record: logging.LogRecord) -> str:
        extra = getattr(record, "fields", None) or {}
        kv = "".join(" %s=%s" % (k, v) for k, v in extra.items())
        line = "%s %s %s node=%d %s%s" % (_iso(record.created), record.levelname, record.name,
                                         self.node_id, self._message(record), kv)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(_Base):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _iso(record.created), "level": record.levelname, "logger": record.name,
               "node": self.node_id, "msg": self._message(record)}
        extra = getattr(record, "fields", None)
        if extra:
            for k, v in extra.items():
                out.setdefault(str(k), v if isinstance(v, (int, float, bool, type(None))) else str(v))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(level: str = "warning", json_lines: bool = False, node_id: int = 0, stream=None) -> None:
    """Configure the root logger once for the process (replaces earlier handlers)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node_id) if json_lines else TextFormatter(node_id))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level.lower(), logging.WARNING))
    # asyncio reports "Task exception was never retrieved" etc. at ERROR: keep those;
    # its DEBUG chatter only with --log-level debug.
    logging.captureWarnings(True)
