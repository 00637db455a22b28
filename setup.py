"""Build hook: the router's hot path compiled to C with mypyc, when it can be.

Everything else about the package is in pyproject.toml. The compiled modules are the
same Python source, type-checked and translated, so a build that cannot compile (no C
compiler, say) installs the pure-Python router instead: slower, never different.
`KEELWAY_PURE_PYTHON=1` skips compiling on purpose.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Imported together at run time: keelway/router/__init__.py loads all of them compiled
# or all of them from source, never a mix (compiled modules share one C library).
HOT_PATH = [
    "keelway/router/headers.py",
    "keelway/router/exchange.py",
    "keelway/router/upstream.py",
    "keelway/router/downstream.py",
]


class OptionalBuildExt(build_ext):
    """A compile that fails leaves the pure-Python router (with a warning), not a
    failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any compiler failure means: fall back
            print(f"keelway: not compiling the router ({exc}); using pure Python",
                  file=sys.stderr)


def ext_modules() -> list[object]:
    if os.environ.get("KEELWAY_PURE_PYTHON") == "1":
        return []
    try:
        from mypyc.build import mypycify

        return list(mypycify(HOT_PATH, group_name="keelway.router.native", opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error
        print(f"keelway: not compiling the router ({exc}); using pure Python",
              file=sys.stderr)
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
