"""The interpreters this box has for builds: Pythons and Node, found and checked.

Owns: which Python runs a build's virtualenv (keelway's own, or the one `.python-version`
or `runtime.txt` names), the box's `node` version, and the check of `engines.node`.

Rules:
- A Python is on the box when it runs: every `python3` and `python3.N` on PATH and in
  pyenv's versions is asked for its version, and one that does not answer (a pyenv
  shim for a version not selected) does not count. A build never uses a Python that a
  tenant's uid could not reach (keelway/identity.py), since the instances run the venv's
  links to it.
- A requested version matches on what it names: `3.12` any 3.12.x, `3.12.1` exactly
  3.12.1; when no exact patch is on the box, the same minor is taken and the build says
  so (a patch release does not change what installs).
- A request the box cannot meet is a BuildInputError that lists the versions it has,
  raised before any install, so a pin to a Python the box lacks never ends in pip's
  "No matching distribution".
- `engines.node` ranges are checked with the npm semver forms real apps use (`>=18`,
  `^20`, `~20.1`, `20.x`, `>=18 <21`, `||`); a form this module cannot read is not
  guessed at: the build goes on and says so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keelway import identity
from keelway.builds.errors import BuildInputError, StagingError

PYTHON_VERSION_FILE = ".python-version"
RUNTIME_FILE = "runtime.txt"
_NAME_RE = re.compile(r"python3(\.\d+)?")
_REQUEST_RE = re.compile(r"(?:python-?)?(\d+)\.(\d+)(?:\.(\d+))?")
_PROBE = ("import json, platform, sys, sysconfig; print(json.dumps({"
          "'version': list(sys.version_info[:3]), 'impl': sys.implementation.name, "
          "'soabi': sysconfig.get_config_var('SOABI') or '', "
          "'machine': platform.machine(), 'libc': '-'.join(platform.libc_ver())}))")


@dataclass(frozen=True, slots=True)
class Python:
    """One interpreter on the box, as it answered: what a venv made with it is tied to."""

    path: str
    version: tuple[int, int, int]
    impl: str
    soabi: str
    machine: str
    libc: str

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    def identity_text(self) -> str:
        """What a dependency cache key takes from the interpreter (keelway/builds/cache.py)."""
        return f"{self.impl}-{self.version_text}-{self.soabi}-{self.machine}-{self.libc}"


@dataclass(frozen=True, slots=True)
class PythonRequest:
    """A version an app asks for, and the file that asked."""

    major: int
    minor: int
    patch: int | None
    source: str

    @property
    def text(self) -> str:
        return f"{self.major}.{self.minor}" + ("" if self.patch is None else f".{self.patch}")


def python_request(tree: Path) -> PythonRequest | None:
    """The Python version `.python-version` (first) or `runtime.txt` names, or None.

    Raises BuildInputError for a file that names no version keelway can read.
    """
    for name in (PYTHON_VERSION_FILE, RUNTIME_FILE):
        path = tree / name
        if not path.is_file():
            continue
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
        wanted = next((line for line in lines if line and not line.startswith("#")), "")
        match = _REQUEST_RE.fullmatch(wanted)
        if match is None:
            raise BuildInputError(
                f"{name}: {wanted!r} is not a Python version keelway can use; write one "
                'like "3.12" (or "python-3.12.1" in runtime.txt)')
        major, minor, patch = match.groups()
        return PythonRequest(int(major), int(minor), None if patch is None else int(patch),
                             name)
    return None


def choose_python(request: PythonRequest | None, *, tenants_reach: bool,
                  progress: Callable[[str], None]) -> Python:
    """The interpreter a build's venv is made with: keelway's own (or, when tenants could
    not reach it, another on the box) with no request; else the one asked for."""
    if request is None:
        own = probe(sys.executable)
        if own is not None and (not tenants_reach or _reachable(own.path)):
            return own
    found = [py for py in box_pythons() if not tenants_reach or _reachable(py.path)]
    if request is None:
        if not found:
            raise StagingError(
                "no python3 that a tenant's uid can run was found on PATH (keelway's own "
                f"{sys.executable} is not reachable by other users): install python3 for "
                "all users, or run keelway from a Python other users can reach")
        return max(found, key=lambda py: py.version)
    same_minor = [py for py in found if py.version[:2] == (request.major, request.minor)]
    exact = [py for py in same_minor if request.patch in (None, py.version[2])]
    if exact:
        return max(exact, key=lambda py: py.version)
    if same_minor:
        chosen = max(same_minor, key=lambda py: py.version)
        progress(f"{request.source} asks for Python {request.text}; this box has "
                 f"{chosen.version_text}, of the same minor version: using it")
        return chosen
    have = ", ".join(sorted({py.version_text for py in found},
                            key=lambda v: tuple(map(int, v.split("."))))) or "none"
    raise BuildInputError(
        f"{request.source} asks for Python {request.text}, which this box does not have "
        f"(it has: {have}); change {request.source} to one of those, or install "
        f"Python {request.major}.{request.minor} for all users")


def _reachable(path: str) -> bool:
    real = Path(path).resolve()
    return bool(real.stat().st_mode & stat.S_IXOTH) and identity.reachable(real.parent)


def box_pythons() -> list[Python]:
    """Every Python on the box that answers (see the module header), one per binary."""
    candidates: list[str] = []
    for entry in os.environ.get("PATH", os.defpath).split(os.pathsep):
        directory = Path(entry or ".")
        try:
            names = sorted(p.name for p in directory.iterdir())
        except OSError:
            continue
        candidates += [str(directory / n) for n in names if _NAME_RE.fullmatch(n)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        candidates += sorted(str(p) for p in pyenv.glob("*/bin/python3"))
    found: dict[str, Python] = {}
    for candidate in candidates:
        try:
            real = str(Path(candidate).resolve())
        except OSError:
            continue
        if real in found:
            continue
        py = probe(candidate)
        if py is not None:
            found[real] = py
    return list(found.values())


def probe(path: str) -> Python | None:
    """Ask the interpreter at `path` what it is; None when it does not answer."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _probe(path, info.st_mtime_ns, info.st_ino)


@functools.lru_cache(maxsize=64)
def _probe(path: str, _mtime_ns: int, _ino: int) -> Python | None:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    try:
        result = subprocess.run([path, "-I", "-c", _PROBE], capture_output=True, env=env,
                                stdin=subprocess.DEVNULL, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    try:
        data = json.loads(result.stdout)
        major, minor, patch = (int(n) for n in data["version"])
        return Python(path, (major, minor, patch), str(data["impl"]), str(data["soabi"]),
                      str(data["machine"]), str(data["libc"]))
    except (ValueError, KeyError, TypeError):
        return None


# -- Node ------------------------------------------------------------------------------

def node_version() -> tuple[int, int, int] | None:
    """The box's `node` version, None when there is no node."""
    try:
        result = subprocess.run(["node", "--version"], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", result.stdout.strip())
    if result.returncode != 0 or match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch)


_COMPARATOR_RE = re.compile(r"(\^|~|>=|<=|>|<|=)?v?(\d+|x|\*)(?:\.(\d+|x|\*))?(?:\.(\d+|x|\*))?")


def satisfies(version: tuple[int, int, int], spec: str) -> bool | None:
    """Whether `version` meets the npm semver range `spec`; None when it cannot be read."""
    alternatives = [part.strip() for part in spec.split("||")]
    answers: list[bool] = []
    for alternative in alternatives:
        if not alternative or alternative in ("*", "x"):
            answers.append(True)
            continue
        hyphen = re.fullmatch(r"(\S+)\s+-\s+(\S+)", alternative)
        parts = ([f">={hyphen[1]}", f"<={hyphen[2]}"] if hyphen
                 else alternative.replace(">= ", ">=").replace("<= ", "<=").split())
        verdicts = [_comparator(version, part) for part in parts]
        if any(v is None for v in verdicts):
            return None
        answers.append(all(verdicts))
    return any(answers)


def _comparator(version: tuple[int, int, int], text: str) -> bool | None:
    match = _COMPARATOR_RE.fullmatch(text)
    if match is None:
        return None
    op, *raw = match.groups()
    given = [None if part in (None, "x", "*") else int(part) for part in raw]
    known = [n for n in given if n is not None]
    if None in given[:len(known)]:
        return None  # a wildcard before a number, like 1.x.3
    floor = tuple(known + [0] * (3 - len(known)))
    if op in (None, "="):
        return tuple(version[:len(known)]) == tuple(known)
    if op == "^":
        lead = next((i for i, n in enumerate(floor) if n != 0), len(known) - 1)
        lead = min(lead, max(len(known) - 1, 0))
        ceiling = list(floor[:lead]) + [floor[lead] + 1] + [0] * (2 - lead)
        return floor <= version < tuple(ceiling)
    if op == "~":
        lead = 0 if len(known) == 1 else 1
        ceiling = list(floor[:lead]) + [floor[lead] + 1] + [0] * (2 - lead)
        return floor <= version < tuple(ceiling)
    if op in (">", "<="):
        # `>1` means above every 1.x.y; `<=1` includes every 1.x.y
        upper = tuple(known + [sys.maxsize] * (3 - len(known)))
        return version > upper if op == ">" else version <= upper
    return version >= floor if op == ">=" else version < floor
