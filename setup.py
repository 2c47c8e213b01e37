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

The hot kernels (KERNELS below: Cython twins of pure functions, issue 14) are
compiled by build_ext when Cython and a C compiler are there. They are
optional: without a compiler (or with XRAFT_NO_CEXT=1 at build time) the
install still succeeds and xraft runs its pure-Python modules, which stay the
reference either way (xraft.node.accel; XRAFT_PURE=1 forces them at run time).
"""
import importlib.util
import os

from setuptools import Command, Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
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


# Compiled kernels: module name -> its .pyx (each has a pure twin it must equal; tests/kernels).
KERNELS = {
    "xraft.node.engine._listpack_c": "node/engine/_listpack_c.pyx",
    "xraft.node.fsm._entry_c": "node/fsm/_entry_c.pyx",
}


def _kernel_extensions() -> list:
    if os.environ.get("XRAFT_NO_CEXT", "") not in ("", "0"):
        print("build_ext: XRAFT_NO_CEXT is set; xraft installs its pure-Python kernels only")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("build_ext: Cython is not installed; xraft installs its pure-Python kernels only")
        return []
    exts = [Extension(name, [src], extra_compile_args=["-O2"]) for name, src in KERNELS.items()]
    # The generated .c goes to build/ (ignored by git), not beside the .pyx.
    return cythonize(exts, build_dir="build/cython", quiet=True,
                     compiler_directives={"language_level": 3})


class optional_build_ext(build_ext):
    """build_ext that never fails the install: a kernel that does not compile is
    left out (a warning says so) and its pure-Python twin is used."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (CCompilerError, DistutilsPlatformError, ...)
            print(f"build_ext: WARNING: compiled kernels not built ({e}); xraft runs pure Python")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            print(f"build_ext: WARNING: {ext.name} not built ({e}); its pure-Python twin is used")


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
    ext_modules=_kernel_extensions(),
    cmdclass={"build": build_with_proto, "build_py": build_py_with_proto, "build_proto": build_proto,
              "build_ext": optional_build_ext},
)
