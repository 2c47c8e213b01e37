"""Which commands of a pipelined batch become one XADD batch request (resp_pipeline.py).

The replies are proven byte for byte against redis-server in
test_resp_pipeline_vs_redis.py; this checks the requests themselves: a run of
the simple XADD form to one key (same NOMKSTREAM) is one XADD_BATCH request,
and everything else stays one COMMAND request per command."""
from xraft.node.engine.errors import CommandError
from xraft.node.fsm.entry import Kind
from xraft.node.fsm.resolve import resolve_command
from xraft.node.server.resp_pipeline import PlainWrite, _expand, _with_xadd_runs, _xadd_run_form


def write(line: str) -> PlainWrite:
    argv = [a.encode() for a in line.split()]
    form = _xadd_run_form(argv) if argv[0].lower() == b"xadd" else None
    if form is not None:          # as plain_write makes it: resolved only if it runs alone
        return PlainWrite(b"xadd", None, 0, 0, form, argv)
    return PlainWrite(argv[0].lower(), resolve_command(0, 0, argv).request, 0, 0)


def test_the_simple_form_only():
    assert _xadd_run_form([b"XADD", b"k", b"*", b"f", b"v"]) == (b"k", False, [b"f", b"v"])
    assert _xadd_run_form([b"xadd", b"k", b"NoMkStream", b"*", b"f", b"v", b"g", b"w"]) == (
        b"k", True, [b"f", b"v", b"g", b"w"])
    for line in ("XADD k 1-1 f v", "XADD k 1-* f v", "XADD k MAXLEN 5 * f v", "XADD k * f v g",
                 "XADD k NOMKSTREAM NOMKSTREAM * f v", "XADD k NOMKSTREAM * f", "XADD k IDMPAUTO p * f v"):
        assert _xadd_run_form([a.encode() for a in line.split()]) is None, line


def test_runs_become_one_request_each():
    batch = [write(line) for line in (
        "XADD a * f 1", "XADD a * f 2", "XADD a * f 3",      # a run: one request
        "XADD a NOMKSTREAM * f 4", "XADD a NOMKSTREAM * f 5",  # NOMKSTREAM differs: a second run
        "XADD b * f 1",                                       # another key, alone: a plain command
        "RPUSH l x",
        "XADD a * f 6", "XADD a 9-1 f v", "XADD a * f 7")]   # an explicit ID breaks the run
    requests, spans = _with_xadd_runs(batch)
    assert [r.kind for r in requests] == [Kind.XADD_BATCH, Kind.XADD_BATCH] + [Kind.COMMAND] * 5
    assert spans == [3, 2, 0, 0, 0, 0, 0]
    first, second = requests[0].xadd, requests[1].xadd
    assert (first.key, first.no_mkstream, len(first.entries)) == (b"a", False, 3)
    assert [list(e[3]) for e in first.entries] == [[b"f", b"1"], [b"f", b"2"], [b"f", b"3"]]
    assert (second.key, second.no_mkstream, len(second.entries)) == (b"a", True, 2)
    assert requests[2].argv == (b"XADD", b"b", b"*", b"f", b"1")   # alone: its own command


def test_results_expand_in_order():
    err = CommandError("ERR x")
    refused = CommandError("ERR too large")
    assert _expand([[b"1-0", None], b"r", err], [2, 0, refused, 3]) == [
        b"1-0", None, b"r", refused, err, err, err]
