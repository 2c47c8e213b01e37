"""Maps the top-level folders onto one distribution, `xraft`.

`xraft` is a namespace package with no folder of its own: `xraft.node` lives in
`node/`, `xraft.client` in `client/`, `xraft.proto` in `proto/` and `xraft.ops` in
`ops/`. Sub-packages are found by walking each folder for `__init__.py`, so adding
one needs no edit here.
"""
import os

from setuptools import setup

ROOTS = {"xraft.node": "node", "xraft.client": "client", "xraft.proto": "proto", "xraft.ops": "ops"}


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


packages, package_dir = _packages()
setup(packages=packages, package_dir=package_dir)
