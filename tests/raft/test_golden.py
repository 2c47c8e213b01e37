"""Golden Raft scenarios: one test per tests/raft/testdata/*.txt file.

Each file drives an InteractionEnv (interaction.py) command by command and
compares the printed Readies, deliveries and states with the recorded output.
XRAFT_REWRITE=1 regenerates the recorded output; every regenerated file must be
read and checked against the Raft paper/thesis before it is kept.
"""
from pathlib import Path

import pytest

from .datadriven import run_file
from .interaction import InteractionEnv

TESTDATA = Path(__file__).parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_testdata_present():
    assert len(FILES) >= 12, f"expected the golden scenario files in {TESTDATA}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden(path):
    env = InteractionEnv()
    run_file(str(path), env.handle)


# ---- the runner itself: a golden test is only worth something if a difference fails it


def _echo(case):
    return " ".join(case.head)  # output = the command line (and input), so we control it


def test_runner_fails_on_difference(tmp_path, monkeypatch):
    monkeypatch.delenv("XRAFT_REWRITE", raising=False)
    f = tmp_path / "t.txt"
    f.write_text("# header\n\ncmd a\n----\ncmd a\n\ncmd b\n----\nnot what it prints\n")
    with pytest.raises(AssertionError, match=r"t.txt:7: output of 'cmd b' differs"):
        run_file(str(f), _echo)


def test_runner_rewrite_keeps_text_and_handles_blank_lines(tmp_path, monkeypatch):
    f = tmp_path / "t.txt"
    original = "# header\n\ncmd a x=(1,2)\n----\nstale\n\nmulti\nin\n----\n\n# tail\n"
    f.write_text(original)
    monkeypatch.setenv("XRAFT_REWRITE", "1")
    run_file(str(f), lambda c: "line1\n\nline3" if c.cmd == "multi" else _echo(c))
    text = f.read_text()
    assert text == ("# header\n\ncmd a x=(1,2)\n----\ncmd a x=(1,2)\n\n"
                    "multi\nin\n----\n----\nline1\n\nline3\n----\n----\n\n# tail\n")
    monkeypatch.delenv("XRAFT_REWRITE")
    run_file(str(f), lambda c: "line1\n\nline3" if c.cmd == "multi" else _echo(c))  # now it passes
