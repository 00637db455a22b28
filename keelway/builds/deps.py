"""An app's dependencies, detected as Heroku's and piku's buildpacks do, installed into
its build, or laid down from the dependency cache when their key matches.

Owns: what a source tree's files say about its dependencies, and the steps that install
them. Detection, first match per language:

    Python  uv.lock (+ pyproject.toml)  `uv sync --frozen --no-install-project --no-dev`
            requirements.txt            `pip install -r requirements.txt`
            pyproject.toml              `pip install` of its [project] dependencies
            (the interpreter: .python-version, else runtime.txt, else keelway's own;
            keelway/builds/toolchain.py)
    Node    package.json                `npm ci` with package-lock.json or
                                        npm-shrinkwrap.json, else `npm install`;
                                        `engines.node` checked first; then its `build`
                                        script when there is no [build] command

keelway installs an app's dependencies, not the app itself: an app runs from its build
directory, so a pyproject app is importable from there (a `src/` layout needs its
Procfile to say so, e.g. `PYTHONPATH=src`).

Rules:
- Every check an app can fail (a Python or Node the box lacks, unreadable files) runs
  before any install, and its error says what the box has.
- The cache key names everything that determines the installed tree
  (keelway/builds/cache.py). A tree that depends on the app's own files (a requirement
  that is a local path or editable, an install without a lockfile) is not cached, and
  the build says so. A miss installs, then publishes the tree before any later step
  (the [build] command, a `build` script) can change it.
- A venv's scripts name the absolute path they were made at: on a hit they are
  rewritten (as new files, never through the shared inode) to the build's own path.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from keelway.builds import toolchain
from keelway.builds.build_step import Progress, StepLimits, run_step
from keelway.builds.cache import CacheUnusable, DepsCache, Entry, key_of
from keelway.builds.errors import BuildInputError, StagingError
from keelway.identity import Identity

VENV_DIR = ".venv"
NODE_MODULES = "node_modules"
REQUIREMENTS = "requirements.txt"
PYPROJECT = "pyproject.toml"
UV_LOCK = "uv.lock"
PACKAGE_JSON = "package.json"
NODE_LOCKFILES = ("package-lock.json", "npm-shrinkwrap.json")
# The root package's own install scripts, which `npm ci` runs after installing: a cache
# hit runs them too, in the order npm does.
_NPM_INSTALL_SCRIPTS = ("preinstall", "install", "postinstall", "prepare")
_INCLUDE_RE = re.compile(r"^\s*(?:-r|--requirement|-c|--constraint)(?:\s+|=)(\S+)")
_LOCAL_RE = re.compile(r"^\s*(?:-e|--editable|\.|/|~|file:)|\s@\s*file:")


@dataclass(frozen=True)
class Context:
    """What every install step of one build shares."""

    tree: Path  # the staging tree, at its temp path
    env: dict[str, str]
    log: BinaryIO
    progress: Progress
    limits: StepLimits
    builder: Identity | None
    cache: DepsCache | None
    app: str
    scratch: Path  # outside the tree: tools' own caches, so none ends up in the build
    outcomes: list[str] = field(default_factory=list)

    def step(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
        run_step(argv, what=what, cwd=self.tree, env=env or self.env, log=self.log,
                 progress=self.progress, limits=self.limits, builder=self.builder)

    def key(self, kind: str, **parts: str) -> str:
        pip_env = {k: v for k, v in sorted(self.env.items()) if k.startswith("PIP_")}
        return key_of({"kind": kind, "app": self.app,
                       "gid": "" if self.builder is None else str(self.builder.gid),
                       "platform": f"{platform.system()}-{platform.machine()}",
                       "env": json.dumps(pip_env), **parts})


def wants_python(tree: Path) -> bool:
    return any((tree / name).is_file() for name in (REQUIREMENTS, PYPROJECT, UV_LOCK))


def wants_node(tree: Path) -> bool:
    return (tree / PACKAGE_JSON).is_file()


def check(tree: Path, *, tenants_reach: bool, progress: Progress) -> toolchain.Python | None:
    """Every check before any install: the Python the app asks for (returned, None for
    an app with no Python dependencies) and the Node it asks for."""
    python = None
    if wants_python(tree):
        python = toolchain.choose_python(toolchain.python_request(tree),
                                         tenants_reach=tenants_reach, progress=progress)
    if wants_node(tree):
        _check_node(read_package_json(tree), progress)
    return python


# -- Python ----------------------------------------------------------------------------

def install_python(ctx: Context, python: toolchain.Python) -> None:
    """Make the build's venv with `python` and its dependencies (see the module header)."""
    tree, venv = ctx.tree, ctx.tree / VENV_DIR
    kind = python_installer(tree)
    if kind == "uv":
        inputs = _digest_files(tree, [UV_LOCK, PYPROJECT])
    elif kind == "pip-requirements":
        inputs = requirements_inputs(tree)
    else:
        inputs = json.dumps(project_dependencies(tree))
    key = None if inputs is None else ctx.key(kind, inputs=inputs,
                                               python=python.identity_text())
    if key is None:
        ctx.progress("requirements.txt installs from the app's own files: its venv is "
                     "not cached")
    entry = None if key is None else _from_cache(ctx, key, venv)
    if entry is not None:
        relocate_venv(venv, Path(entry.origin).parent, tree)
        ctx.outcomes.append("python: cached")
        return
    ctx.progress(f"creating a virtualenv with Python {python.version_text}")
    if kind == "uv":
        _uv_sync(ctx, python)
    else:
        ctx.step([python.path, "-m", "venv", str(venv)], "create the virtualenv")
        _pip_install(ctx, kind)
    ctx.outcomes.append("python: installed")
    if key is not None:
        _publish(ctx, key, venv, "venv")


def python_installer(tree: Path) -> str:
    """How an app that wants Python installs its dependencies (the module header's
    first match): `uv`, `pip-requirements` or `pip-project`; also a cache key's kind."""
    if (tree / UV_LOCK).is_file():
        return "uv"
    if (tree / REQUIREMENTS).is_file():
        return "pip-requirements"
    return "pip-project"


def _pip_install(ctx: Context, kind: str) -> None:
    pip = [str(ctx.tree / VENV_DIR / "bin" / "python"), "-m", "pip", "install",
           "--disable-pip-version-check", "--no-input"]
    if kind == "pip-requirements":
        if not _lists_requirements(ctx.tree / REQUIREMENTS):
            ctx.progress("requirements.txt lists nothing to install")
            return
        ctx.progress("installing requirements")
        ctx.step([*pip, "-r", REQUIREMENTS], "pip install -r requirements.txt")
        return
    wanted = project_dependencies(ctx.tree)
    if not wanted:
        ctx.progress("pyproject.toml lists no dependencies to install")
        return
    ctx.progress(f"installing the {len(wanted)} dependencies of pyproject.toml")
    ctx.step([*pip, *wanted], "pip install of pyproject.toml's dependencies")


def _uv_sync(ctx: Context, python: toolchain.Python) -> None:
    try:
        from uv import find_uv_bin
        uv = find_uv_bin()
    except (ImportError, FileNotFoundError) as exc:
        raise StagingError("the app has a uv.lock but keelway's `uv` is missing: "
                           "reinstall keelway (uv is one of its dependencies)") from exc
    env = {**ctx.env, "UV_PROJECT_ENVIRONMENT": str(ctx.tree / VENV_DIR),
           "UV_CACHE_DIR": str(ctx.scratch / "uv"), "UV_PYTHON_DOWNLOADS": "never",
           "UV_LINK_MODE": "copy", "UV_NO_PROGRESS": "1"}
    env.pop("VIRTUAL_ENV", None)
    ctx.progress("installing uv.lock's dependencies with uv")
    ctx.step([uv, "sync", "--frozen", "--no-install-project", "--no-dev", "--python",
              python.path], "uv sync --frozen", env=env)


def project_dependencies(tree: Path) -> list[str]:
    """pyproject.toml's `[project] dependencies` (BuildInputError when unreadable)."""
    path = tree / PYPROJECT
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(errors="replace"))
    except tomllib.TOMLDecodeError as exc:
        raise BuildInputError(f"{PYPROJECT} is not valid TOML: {exc}") from exc
    wanted = data.get("project", {}).get("dependencies", [])
    if not isinstance(wanted, list) or not all(isinstance(d, str) for d in wanted):
        raise BuildInputError(f"{PYPROJECT} [project] dependencies must be a list of "
                              "requirement strings")
    for item in wanted:
        if item.strip().startswith("-"):  # pip would read it as an option
            raise BuildInputError(f"{PYPROJECT} [project] dependencies: {item!r} is not a "
                                  "requirement (PEP 508), it looks like a pip option")
    return list(wanted)


def requirements_inputs(tree: Path) -> str | None:
    """The bytes requirements.txt installs from, with every file it includes (-r, -c);
    None when a requirement is a local path, which the key cannot cover."""
    seen: dict[str, str] = {}
    todo = [REQUIREMENTS]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        try:
            text = (tree / rel).read_text(errors="replace")
        except OSError:
            seen[rel] = "missing"  # pip will say so
            continue
        seen[rel] = text
        for line in text.splitlines():
            if _LOCAL_RE.search(line):
                return None
            include = _INCLUDE_RE.match(line)
            if include:
                todo.append(os.path.normpath(os.path.join(os.path.dirname(rel),
                                                          include[1])))
    return json.dumps(seen, sort_keys=True)


def _lists_requirements(path: Path) -> bool:
    """False when requirements.txt holds only blank lines and comments (nothing to run)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return True
    return False


def relocate_venv(venv: Path, old_root: Path, new_root: Path) -> None:
    """Point the venv's scripts at `new_root` instead of `old_root`.

    Scripts carry `#!<root>/.venv/bin/python`. Text files in `.venv/bin` and
    `pyvenv.cfg` that name the old root are replaced by new files: never written in
    place, since the old file may be an inode the dependency cache shares.
    """
    old, new = os.fsencode(str(old_root)) + b"/", os.fsencode(str(new_root)) + b"/"
    candidates = [venv / "pyvenv.cfg"]
    bin_dir = venv / "bin"
    if bin_dir.is_dir():
        candidates += sorted(bin_dir.iterdir())
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data and b"\0" not in data:
            mode = path.stat().st_mode & 0o7777
            path.unlink()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data.replace(old, new))
            os.chmod(path, mode | 0o200)


# -- Node ------------------------------------------------------------------------------

def read_package_json(tree: Path) -> dict[str, Any]:
    try:
        data = json.loads((tree / PACKAGE_JSON).read_text(errors="replace"))
    except ValueError as exc:
        raise BuildInputError(f"{PACKAGE_JSON} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BuildInputError(f"{PACKAGE_JSON} must hold a JSON object")
    return data


def _scripts(package: dict[str, Any]) -> dict[str, str]:
    scripts = package.get("scripts") or {}
    return {k: v for k, v in scripts.items() if isinstance(v, str)} if isinstance(
        scripts, dict) else {}


def _check_node(package: dict[str, Any], progress: Progress) -> None:
    have = toolchain.node_version()
    if have is None:
        raise StagingError(f"the app has a {PACKAGE_JSON} but this box has no `node`: "
                           "install Node.js (and npm) for all users")
    if shutil.which("npm") is None:
        raise StagingError(f"the app has a {PACKAGE_JSON} but this box has no `npm`")
    engines = package.get("engines")
    wanted = engines.get("node") if isinstance(engines, dict) else None
    if not isinstance(wanted, str):
        return
    verdict = toolchain.satisfies(have, wanted)
    shown = ".".join(map(str, have))
    if verdict is None:
        progress(f"{PACKAGE_JSON} engines.node {wanted!r} is a range keelway cannot read; "
                 f"building with this box's node {shown}")
    elif not verdict:
        raise BuildInputError(
            f"{PACKAGE_JSON} engines.node asks for {wanted!r}, and this box has node "
            f"{shown}: change engines.node to a range that includes {have[0]}, or "
            "install that Node version")


def node_lockfile(tree: Path) -> str | None:
    """The lockfile `npm ci` installs from (None: `npm install` resolves anew)."""
    return next((name for name in NODE_LOCKFILES if (tree / name).is_file()), None)


def install_node(ctx: Context, *, run_build_script: bool) -> None:
    """node_modules from the lockfile (cached) or package.json (not), then the
    `build` script when asked (see the module header)."""
    tree = ctx.tree
    package = read_package_json(tree)
    scripts = _scripts(package)
    lockfile = node_lockfile(tree)
    version = toolchain.node_version()
    env = {**ctx.env, "npm_config_cache": str(ctx.scratch / "npm"),
           "npm_config_update_notifier": "false", "npm_config_fund": "false",
           "npm_config_audit": "false"}
    key = None
    if lockfile is None:
        ctx.progress("no package-lock.json: `npm install` resolves anew, not cached")
    else:
        key = ctx.key("npm-ci", inputs=_digest_files(tree, [lockfile, PACKAGE_JSON]) or "",
                      node=".".join(map(str, version or ())))
    if key is not None and _from_cache(ctx, key, tree / NODE_MODULES) is not None:
        ctx.outcomes.append("node: cached")
        for name in _NPM_INSTALL_SCRIPTS:
            if name in scripts:
                ctx.step(["npm", "run-script", name], f"npm run-script {name}", env=env)
    else:
        command = ["npm", "ci"] if lockfile else ["npm", "install"]
        ctx.progress(f"installing node modules: {' '.join(command)}")
        ctx.step(command, " ".join(command), env=env)
        ctx.outcomes.append("node: installed")
        if key is not None and (tree / NODE_MODULES).is_dir():
            _publish(ctx, key, tree / NODE_MODULES, "node_modules")
    if run_build_script and "build" in scripts:
        ctx.progress("running package.json's build script")
        ctx.step(["npm", "run-script", "build"], "npm run-script build", env=env)


# -- the cache -------------------------------------------------------------------------

def _from_cache(ctx: Context, key: str, dest: Path) -> Entry | None:
    """The entry `key` laid down at `dest`, or None (nothing laid down) on a miss."""
    if ctx.cache is None:
        return None
    entry = ctx.cache.lookup(key)
    if entry is None:
        ctx.progress(f"dependency cache: no entry {key[:12]} yet; installing")
        return None
    try:
        linked = ctx.cache.link_into(entry, dest)
    except CacheUnusable as exc:
        ctx.progress(f"dependency cache: {exc}; installing")
        return None
    if ctx.builder is not None:
        # the directories are this build's own, the builder's until the seal; the
        # shared files stay root's and read-only
        for directory, _dirs, _files in os.walk(dest):
            os.chown(directory, ctx.builder.uid, ctx.builder.gid)
    ctx.progress(f"dependency cache: reusing {dest.name} {key[:12]} ({linked} files linked)")
    return entry


def _publish(ctx: Context, key: str, tree: Path, what: str) -> None:
    if ctx.cache is None:
        return
    gid = None if ctx.builder is None else ctx.builder.gid
    try:
        if ctx.cache.publish(key, tree, what=what, owner_gid=gid):
            ctx.progress(f"dependency cache: kept {what} as {key[:12]}")
    except CacheUnusable as exc:
        ctx.progress(f"dependency cache: {exc}; {what} not kept")


def _digest_files(tree: Path, names: list[str]) -> str | None:
    found = {}
    for name in names:
        path = tree / name
        if path.is_file():
            found[name] = path.read_text(errors="replace")
    return json.dumps(found, sort_keys=True)
