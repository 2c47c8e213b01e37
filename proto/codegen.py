"""Generates the Python package xraft.proto.v1 from proto/xraft/v1/*.proto.

The generated modules (client_pb2.py/.pyi, client_pb2_grpc.py, peer_pb2.py/.pyi,
peer_pb2_grpc.py) are never committed nor edited: `pip install [-e] .` runs
`generate()` (setup.py's build_proto command) and `xraft.proto.v1` checks at
import time that they still match the .proto files (`ensure_fresh()`), so an
edited .proto can never hide behind a stale module.

Why the staging: protoc names a generated module's imports after the .proto
file's path relative to its include root. The sources live at
proto/xraft/v1/*.proto (the path other languages' users see, package xraft.v1),
but the Python package is xraft.proto.v1. So each .proto is copied to a
temporary include tree as xraft/proto/v1/<name>.proto (its imports of
"xraft/v1/..." rewritten the same way) and compiled from there: the generated
`import` lines then read `from xraft.proto.v1 import ...`. Verified after every
run (`_check_imports`).

Freshness is by content, not mtime: a stamp module, _generated.py, records the
SHA-256 of the sources it was made from. A git checkout or a copied tree can set
any mtimes; a digest cannot be fooled by them.

This file is loaded by path from setup.py before xraft is installed, so it uses
only the standard library and (lazily) grpc_tools.

    python -m xraft.proto.codegen            regenerate if stale
    python -m xraft.proto.codegen --force    regenerate
    python -m xraft.proto.codegen --check    exit 1 if stale
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent  # proto/ in a checkout; .../xraft/proto when installed
SOURCE_DIR = HERE / "xraft" / "v1"  # the .proto files
OUT_DIR = HERE / "v1"  # the package xraft.proto.v1
STAGED = ("xraft", "proto", "v1")  # where the sources sit in protoc's include tree
PROTOS = ("client.proto", "peer.proto")
STAMP = "_generated.py"
# Bumped whenever this generator's output changes for the same sources, so an
# old tree is regenerated.
CODEGEN_VERSION = 1
MAX_PROTO_BYTES = 1 << 20  # a .proto larger than this is a mistake, not an API
_IMPORT_RE = re.compile(r'^(\s*import\s+(?:public\s+|weak\s+)?")xraft/v1/', re.M)


class CodegenError(RuntimeError):
    """protoc failed, or its output does not look as this module expects."""


def outputs(out_dir: Path = OUT_DIR) -> list[Path]:
    """Every file generate() writes, the stamp last."""
    files = []
    for name in PROTOS:
        stem = name[: -len(".proto")]
        files += [out_dir / f"{stem}_pb2.py", out_dir / f"{stem}_pb2.pyi", out_dir / f"{stem}_pb2_grpc.py"]
    return files + [out_dir / STAMP]


def _read_sources(src_dir: Path) -> dict[str, bytes]:
    sources = {}
    for name in PROTOS:
        path = src_dir / name
        if path.stat().st_size > MAX_PROTO_BYTES:
            raise CodegenError(f"{path} is over {MAX_PROTO_BYTES} bytes")
        sources[name] = path.read_bytes()
    return sources


def source_digest(src_dir: Path = SOURCE_DIR) -> str:
    """SHA-256 over the generator version and every source's name and bytes."""
    h = hashlib.sha256(f"xraft-codegen-{CODEGEN_VERSION}\0".encode())
    for name, data in sorted(_read_sources(src_dir).items()):
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def _stamped_digest(out_dir: Path) -> str | None:
    try:
        text = (out_dir / STAMP).read_text()
    except OSError:
        return None
    m = re.search(r'^SOURCE_DIGEST = "([0-9a-f]{64})"$', text, re.M)
    return m.group(1) if m else None


def stale_reason(src_dir: Path = SOURCE_DIR, out_dir: Path = OUT_DIR) -> str | None:
    """Why the generated files do not match the sources, or None if they do."""
    missing = [p.name for p in outputs(out_dir) if not p.exists()]
    if missing:
        return "missing " + ", ".join(missing)
    if _stamped_digest(out_dir) != source_digest(src_dir):
        return "the .proto files changed since the code was generated"
    return None


def _check_imports(name: str, text: str) -> None:
    """The whole point of the staging: no generated import may name xraft.v1."""
    if re.search(r"^\s*(from|import)\s+xraft\.v1\b", text, re.M):
        raise CodegenError(f"{name} imports xraft.v1 instead of xraft.proto.v1")


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Atomic replace (readers see the old or the new file, never half) and
    only when the bytes differ, so an unchanged module keeps its mtime and its
    cached bytecode."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; these are ordinary package files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def generate(src_dir: Path = SOURCE_DIR, out_dir: Path = OUT_DIR) -> list[Path]:
    """Compile the sources into out_dir; returns the files whose bytes changed."""
    try:
        from grpc_tools import protoc
    except ImportError as e:  # the build requires it; at run time only [dev] has it
        raise CodegenError("grpcio-tools is needed to generate xraft.proto.v1: pip install grpcio-tools") from e
    import grpc_tools

    sources = _read_sources(src_dir)
    digest = source_digest(src_dir)
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory(prefix="xraft-codegen-") as tmp:
        include, gen = Path(tmp, "include"), Path(tmp, "gen")
        staged = include.joinpath(*STAGED)
        staged.mkdir(parents=True)
        gen.mkdir()
        for name, data in sources.items():
            text = _IMPORT_RE.sub(r"\1" + "/".join(STAGED) + "/", data.decode("utf-8"))
            (staged / name).write_text(text, encoding="utf-8")
        args = [
            "grpc_tools.protoc",
            f"--proto_path={include}",
            f"--proto_path={well_known}",
            f"--python_out={gen}",
            f"--pyi_out={gen}",
            f"--grpc_python_out={gen}",
        ] + ["/".join(STAGED + (name,)) for name in PROTOS]
        rc = protoc.main(args)  # protoc prints its diagnostics to stderr itself
        if rc != 0:
            raise CodegenError(f"protoc failed (exit {rc}) on {src_dir}; its messages name the staged "
                               f"copies under {include}, whose line numbers are the sources'")
        produced = gen.joinpath(*STAGED)
        out_dir.mkdir(parents=True, exist_ok=True)
        changed = []
        for path in outputs(out_dir)[:-1]:
            data = (produced / path.name).read_bytes()  # a missing output is a CodegenError below
            _check_imports(path.name, data.decode("utf-8"))
            if _write_if_changed(path, data):
                changed.append(path)
    try:
        from importlib.metadata import version

        tools = version("grpcio-tools")
    except Exception:  # noqa: BLE001 - the version is only informative
        tools = "unknown"
    stamp = (
        '"""Written by xraft.proto.codegen; do not edit. The digest of the .proto files\n'
        'the modules beside it were generated from (see codegen.stale_reason)."""\n'
        f'SOURCE_DIGEST = "{digest}"\n'
        f'GRPCIO_TOOLS = "{tools}"\n'
    )
    # Written last: a crash midway leaves the old stamp, so the next check regenerates.
    if _write_if_changed(out_dir / STAMP, stamp.encode()):
        changed.append(out_dir / STAMP)
    return changed


@contextlib.contextmanager
def _locked(out_dir: Path):
    """An exclusive lock on out_dir, so that parallel importers (pytest -n)
    regenerate once rather than all at once. POSIX only; elsewhere no lock,
    which is still safe because every write is an atomic replace."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".codegen.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_fresh(src_dir: Path = SOURCE_DIR, out_dir: Path = OUT_DIR) -> None:
    """Called when xraft.proto.v1 is imported: regenerate stale code if
    grpcio-tools is at hand, else fail loudly rather than run on stale code.

    Without the sources (an install that did not ship them) there is nothing
    to compare with; the generated files must then simply exist.
    """
    if not all((src_dir / name).is_file() for name in PROTOS):
        if all(p.exists() for p in outputs(out_dir)):
            return
        raise ImportError(f"xraft.proto.v1 was never generated and {src_dir} has no .proto sources")
    if stale_reason(src_dir, out_dir) is None:
        return
    with _locked(out_dir):
        reason = stale_reason(src_dir, out_dir)  # another process may have just done it
        if reason is None:
            return
        try:
            generate(src_dir, out_dir)
        except CodegenError as e:
            raise ImportError(
                f"xraft.proto.v1 is stale ({reason}) and could not be regenerated: {e}. "
                "Run `python -m pip install -e .` (or `python proto/codegen.py`) in the checkout."
            ) from e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    ap.add_argument("--check", action="store_true", help="only report; exit 1 if stale")
    ap.add_argument("--src", type=Path, default=SOURCE_DIR)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    a = ap.parse_args(argv)
    reason = stale_reason(a.src, a.out)
    if a.check:
        print(reason or "up to date")
        return 1 if reason else 0
    if reason is None and not a.force:
        print("up to date")
        return 0
    changed = generate(a.src, a.out)
    print(f"generated {a.out}: {len(changed)} file(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
