"""The PATH of every process of an app, its build steps, its generations and its
one-off runs alike: its build's own bin directories, then the system's.

The system's part is a fixed default (systemd's for services), never the PATH of the
control plane that spawns it: that PATH holds keelway's own virtualenv (an app would
find keelway's `python`, and pip would install into it) and whatever the shell that
started the daemon had. The build's directories are listed whether they exist yet or
not: a build step creates them, and a later step finds what it installed.

Leaf module: no keelway imports (builds and runtime both use it).
"""

from __future__ import annotations

from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where a build's own programs are: its Python virtualenv's and its npm packages'.
BUILD_BIN_DIRS = (".venv/bin", "node_modules/.bin")


def app_path(build_dir: Path) -> str:
    """The PATH of a process whose build is (or is being staged) at `build_dir`."""
    return ":".join([*(str(build_dir / d) for d in BUILD_BIN_DIRS), SYSTEM_PATH])
