"""Maps the top-level folders onto one distribution, `xraft`.

`xraft` is a namespace package with no folder of its own: `xraft.node` lives in
`node/`, `xraft.client` in `client/`, `xraft.proto` in `proto/` and `xraft.ops` in
`ops/`, `xraft.spark` (the PySpark connector, extra `xraft[spark]`) in `spark/`.
Sub-packages are found by walking each folder for `__init__.py`, so adding
one needs no edit here.

`xraft.proto.v1`'s modules are generated from proto/xraft/v1/*.proto by the
build_proto command below (see proto/codegen.py), which runs first in every
build: `pip install .` (wheel) and `pip install -e .` (PEP 660 editable) alike.
It writes into the source tree, proto/v1/: an editable install imports from
there, and build_py copies from there into a wheel.
"""
import importlib.util
import os

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.command.build_py import build_py

ROOTS = {"xraft.node": "node", "xraft.client": "client", "xraft.proto": "proto", "xraft.ops": "ops",
         "xraft.spark": "spark"}


def _packages():
    packages, package_dir = [], {}
    for name, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" not in filenames:
                continue
            rel = os.path.relpath(dirpath, folder)
            pkg = name if rel == "." else name + "." + rel.replace(os.sep, ".")
            packages.append(pkg)
            package_dir[pkg] = dirpath
    return packages, package_dir


def _codegen():
    """proto/codegen.py loaded by path: xraft is not importable while it is being built."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proto", "codegen.py")
    spec = importlib.util.spec_from_file_location("_xraft_codegen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_proto(Command):
    """Generate xraft.proto.v1 (protobuf + gRPC modules and .pyi stubs) with grpcio-tools."""

    description = "generate xraft.proto.v1 from proto/xraft/v1/*.proto"
    user_options = []
    editable_mode = False  # set by editable_wheel; the output goes to the source tree either way

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        # Always compile (about a second): the build environment's grpcio-tools may
        # differ from the one that made the files already in the tree.
        changed = _codegen().generate()
        print(f"build_proto: {len(changed)} generated file(s) changed")

    def get_source_files(self):
        return [os.path.join("proto", "xraft", "v1", name) for name in _codegen().PROTOS]

    def get_outputs(self):
        return []  # build_py packs the generated modules like any other

    def get_output_mapping(self):
        return {}


class build_with_proto(build):
    # First, so that build_py finds the generated modules. editable_wheel runs
    # these sub-commands one by one and swallows a custom build_py's errors, so
    # codegen must be a sub-command of its own for a failure to stop the install.
    sub_commands = [("build_proto", None)] + build.sub_commands


class build_py_with_proto(build_py):
    def run(self):
        self.run_command("build_proto")  # no-op if build already ran it
        super().run()


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    # Data files are listed, not swept in: include_package_data would take the
    # .proto sources (in the sdist through build_proto.get_source_files) for data
    # of a package "xraft.proto.xraft.v1" and warn. Wheels carry the generated
    # modules and stubs; the sources stay in the sdist, where codegen runs.
    include_package_data=False,
    package_data={"xraft.proto.v1": ["*.pyi"]},
    cmdclass={"build": build_with_proto, "build_py": build_py_with_proto, "build_proto": build_proto},
)
