"""A small data-driven test runner (the file format of cockroachdb/datadriven).

A test file is a sequence of blocks, separated by free text (comments starting
with '#', blank lines) that is kept verbatim:

    command arg1 key=val key=(a,b)
    optional input lines
    ----
    expected output
    (ends at the first blank line)

When the output itself contains blank lines, the block is written with a
doubled separator and ends at a doubled separator:

    command
    ----
    ----
    line

    line after a blank
    ----
    ----

`run_file(path, handler)` runs each block through `handler(case) -> str` and
compares with the expected output, stopping at the first mismatch (later blocks
depend on the state the earlier ones left behind). With XRAFT_REWRITE=1 it
instead writes the file back with every expected output replaced by the actual
one; the comments and commands are preserved byte for byte.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Callable, Union

SEPARATOR = "----"


class DataDrivenError(Exception):
    """A malformed test file or a bad command line (a test bug, not a Raft bug)."""


@dataclass
class Arg:
    key: str
    vals: list[str] = field(default_factory=list)  # [] for a bare word such as "3"


@dataclass
class TestCase:
    path: str
    line: int  # 1-based line of the command
    cmd: str
    args: list[Arg]
    input: list[str]  # lines between the command and the separator
    expected: str  # without the trailing newline
    head: list[str] = field(default_factory=list)  # the command and input lines, verbatim

    def where(self) -> str:
        return f"{self.path}:{self.line}"

    # ---- argument helpers used by handlers

    def positional(self) -> list[str]:
        return [a.key for a in self.args if not a.vals and "=" not in a.key]

    def has(self, key: str) -> bool:
        return any(a.key == key for a in self.args)

    def get(self, key: str, default: str | None = None) -> str | None:
        for a in self.args:
            if a.key == key:
                if len(a.vals) != 1:
                    raise DataDrivenError(f"{self.where()}: {key}= takes one value")
                return a.vals[0]
        return default

    def get_list(self, key: str) -> list[str]:
        for a in self.args:
            if a.key == key:
                return list(a.vals)
        return []

    def get_int(self, key: str, default: int | None = None) -> int | None:
        v = self.get(key)
        return default if v is None else int(v)

    def get_bool(self, key: str, default: bool) -> bool:
        v = self.get(key)
        if v is None:
            return default
        if v not in ("true", "false"):
            raise DataDrivenError(f"{self.where()}: {key}= must be true or false, not {v!r}")
        return v == "true"


def split_args(text: str) -> list[str]:
    """Split on whitespace outside parentheses: 'a k=(1, 2) b' -> ['a', 'k=(1, 2)', 'b']."""
    out: list[str] = []
    cur = ""
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise DataDrivenError(f"unbalanced ')' in {text!r}")
        if ch.isspace() and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise DataDrivenError(f"unbalanced '(' in {text!r}")
    if cur:
        out.append(cur)
    return out


def parse_arg(tok: str) -> Arg:
    if "=" not in tok:
        return Arg(tok)
    key, val = tok.split("=", 1)
    if val.startswith("(") and val.endswith(")"):
        inner = val[1:-1].replace(",", " ")
        return Arg(key, inner.split())
    return Arg(key, [val])


Item = Union[str, TestCase]  # verbatim text line, or a block


def parse(path: str, text: str) -> list[Item]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    items: list[Item] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            items.append(line)
            i += 1
            continue
        start = i
        words = split_args(line)
        cmd, args = words[0], [parse_arg(w) for w in words[1:]]
        i += 1
        inp: list[str] = []
        while i < len(lines) and lines[i] != SEPARATOR:
            if not lines[i].strip():
                raise DataDrivenError(f"{path}:{start + 1}: command {cmd!r} has no '{SEPARATOR}'")
            inp.append(lines[i])
            i += 1
        if i >= len(lines):
            raise DataDrivenError(f"{path}:{start + 1}: command {cmd!r} has no '{SEPARATOR}'")
        i += 1  # the separator
        out: list[str] = []
        if i < len(lines) and lines[i] == SEPARATOR:  # doubled: ends at a doubled separator
            i += 1
            while i + 1 < len(lines) and not (lines[i] == SEPARATOR and lines[i + 1] == SEPARATOR):
                out.append(lines[i])
                i += 1
            if i + 1 >= len(lines):
                raise DataDrivenError(f"{path}:{start + 1}: unterminated '{SEPARATOR}' block")
            i += 2
        else:
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
        items.append(TestCase(path, start + 1, cmd, args, inp, "\n".join(out), lines[start:start + 1] + inp))
    return items


def format_case(case: TestCase, output: str) -> str:
    head = case.head + [SEPARATOR]
    body = output.rstrip("\n")
    if any(not ln.strip() for ln in body.split("\n")):
        return "\n".join(head + [SEPARATOR, body, SEPARATOR, SEPARATOR])
    return "\n".join(head + [body])


def case_command_line(case: TestCase) -> str:
    return case.head[0] if case.head else case.cmd


def rewrite_requested() -> bool:
    return os.environ.get("XRAFT_REWRITE", "") not in ("", "0")


def run_file(path: str, handler: Callable[[TestCase], str]) -> None:
    """Run every block of `path`; raise AssertionError at the first mismatch (or rewrite)."""
    with open(path, encoding="utf-8") as f:
        original = f.read()
    items = parse(path, original)
    rewrite = rewrite_requested()
    pieces: list[str] = []
    for it in items:
        if isinstance(it, str):
            pieces.append(it)
            continue
        actual = handler(it).rstrip("\n") or "ok"
        if rewrite:
            pieces.append(format_case(it, actual))
        elif actual != it.expected:
            diff = "\n".join(difflib.unified_diff(it.expected.split("\n"), actual.split("\n"),
                                                  "expected", "actual", lineterm=""))
            raise AssertionError(f"{it.where()}: output of '{case_command_line(it)}' differs "
                                 f"(XRAFT_REWRITE=1 regenerates; read the result before keeping it)"
                                 f"\n{diff}")
    if rewrite:
        text = "\n".join(pieces) + "\n"
        if text != original:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
