"""Staging: turn a directory, tarball or git ref into `builds/<app>/<digest>/`.

Owns the layout of `builds_dir`:

    builds/<app>/<digest>/        a complete, sealed build: source + build outputs
                                  (`.venv/`, `node_modules/` as keelway/builds/deps.py
                                  detects them, anything the [build] command wrote,
                                  `.keelway-build.log`)
    builds/<app>/.tmp-<random>/   a staging in progress, or a crash's leftover
    builds/<app>/.tmp-<random>.tar  a git export in progress, or a crash's leftover

Invariants:
- A build is named by the digest of its SOURCE content (tree.content_digest), computed
  before the build runs; the same source is built once and reused after that.
- A digest directory exists only complete: everything happens in a `.tmp-` directory,
  which is sealed (read-only), flushed, then renamed to `<digest>`, then the parent
  directory is flushed. A crash at any point before the rename leaves only `.tmp-`
  entries, which `sweep` removes at control-plane boot; after it, the build is whole.
- The same tree gives the same build whichever way it comes: a directory, a tarball and a
  git export all stage only what the ignore rules keep (keelway/builds/ignore.py: the
  defaults and the source's root `.keelwayignore`).
- The manifest is validated before any build step runs and before anything is named.
- A BuildError leaves nothing named and no temp behind.
- No process started by a build outlives it: each step runs in its own process group
  (and cgroup, where the box has them), which is killed once the step's main process
  exits or it passes one of the build's limits (time, disk, memory).

Known limit: a build is built at its temp path and then renamed, so any absolute path a
build step bakes in points at the temp path. keelway rewrites the venv's own scripts
(`.venv/bin/*`, `pyvenv.cfg`) to the final path; other tools' absolute paths are not
rewritten, so build commands should produce relocatable output.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, assert_never

from keelway import identity, names
from keelway.builds import deps
from keelway.builds.build_step import Confine, Progress, StepLimits, build_env
from keelway.builds.cache import DepsCache
from keelway.builds.errors import BuildError, ManifestError, SourceError, StagingError
from keelway.builds.extract import safe_extract_tar
from keelway.builds.manifest import CONFIG_FILE, Manifest, load_manifest
from keelway.builds.tree import (
    BUILD_LOG,
    content_digest,
    copy_source_dir,
    fsync_tree,
    remove_tree,
    seal,
)
from keelway.durable import TEMP_PREFIX, fsync_dir
from keelway.identity import Identity
from keelway.limits import BUILD_TIMEOUT_S, BuildLimits, box_build_limits

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
VENV_DIR = deps.VENV_DIR
REQUIREMENTS = deps.REQUIREMENTS
# The box's build limits where a caller gives none (tests, tools): the built-in ones.
BOX_BUILD_LIMITS = box_build_limits()
_GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


class SourceKind(Enum):
    DIRECTORY = "directory"
    TARBALL = "tarball"
    GIT = "git"


@dataclass(frozen=True, slots=True)
class StagedBuild:
    app: str
    digest: str
    path: Path
    manifest: Manifest
    reused: bool
    # The commit a git source was exported from (None for a directory or a tarball).
    commit: str | None = None


@dataclass(frozen=True, slots=True)
class _Job:
    """How one staging builds, the same at every stage of it: for which app, saying
    what it does to `progress`, within the box's `limits` (each step in a cgroup from
    `confine`, where there is one), as `builder`, with `cache`."""

    app: str
    progress: Progress
    limits: BuildLimits
    builder: Identity | None
    cache: DepsCache | None
    confine: Confine | None


def _no_progress(_message: str) -> None:
    return None


def stage(
    source: Path | str,
    *,
    builds_dir: Path,
    app: str,
    ref: str | None = None,
    git: bool = False,
    progress: Progress = _no_progress,
    limits: BuildLimits = BOX_BUILD_LIMITS,
    builder: Identity | None = None,
    cache: DepsCache | None = None,
    confine: Confine | None = None,
) -> StagedBuild:
    """Stage `source` as a build of `app` and return it, built and sealed. With a
    `builder` (keelway/identity.py) the build steps run as it, in a tree it owns until
    the seal, and the sealed build is root's, readable by the builder's group alone.

    With a `cache` (keelway/builds/cache.py), dependencies whose key matches an entry
    are linked from it, and those installed here are kept in it.
    The build runs under the app's `[build]` limits over the box's `limits`, which are
    their ceiling (a manifest asking for more is refused with a ManifestError before
    anything runs); each step's memory is enforced by a cgroup from `confine` (none:
    not enforced), its time and disk here (keelway/builds/build_step.py).
    `git=True` or a `ref` exports that commit (default HEAD) of the repository at
    `source`; otherwise a directory is copied and a file must be a tar archive.
    Raises a BuildError subclass (ManifestError, SourceError, UnsafeArchiveError,
    BuildCommandError, StagingError); after any exception nothing new is named in
    `builds_dir/<app>` and the temp directory is removed (a crash leaves it to `sweep`).
    """
    source = Path(source)
    app_dir = Path(builds_dir) / app
    try:
        kind = checked_source(source, builds_dir=builds_dir, app=app, ref=ref, git=git)
        if not app_dir.is_dir():
            app_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fsync_dir(app_dir.parent)  # the build's name must survive a crash with it
        tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=app_dir))  # 0700, as a build is
    except OSError as exc:
        raise StagingError(f"stage {app} from {source}: {exc}") from exc
    try:
        return _stage_into(tmp, source, kind, ref, _Job(app, progress, limits, builder,
                                                        cache, confine))
    except BuildError:
        remove_tree(tmp)
        raise
    except OSError as exc:
        remove_tree(tmp)
        raise StagingError(f"stage {app} from {source}: {exc}") from exc
    except BaseException:
        remove_tree(tmp)  # KeyboardInterrupt, bugs: still leave nothing behind
        raise


def checked_source(source: Path, *, builds_dir: Path, app: str, ref: str | None,
                   git: bool) -> SourceKind:
    """What `source` is, refused (SourceError) before anything is written when it is
    nothing `stage` can stage for `app`."""
    if not names.APP.accepts(app):
        # The API refused it already; this guards the path builds/<app> for any caller.
        raise SourceError(f"app name {app!r} is not valid: {names.APP.hint}")
    kind = _source_kind(source, ref=ref, git=git)
    if kind is SourceKind.DIRECTORY and _is_within(Path(builds_dir) / app, source):
        raise SourceError(
            f"the builds directory {builds_dir} is inside the source {source}; "
            "stage from a directory that does not contain keelway's state"
        )
    return kind


def build_dir(builds_dir: Path, app: str, digest: str) -> Path:
    """Where the build of `app` named `digest` is, once staged whole."""
    return Path(builds_dir) / app / digest


def unpack(kind: SourceKind, source: Path, ref: str | None, dest: Path,
           progress: Progress) -> str | None:
    """Lay the tree a build stages from `source` down in the empty directory `dest`
    (the ignore rules applied); the commit a git source was exported from."""
    match kind:
        case SourceKind.DIRECTORY:
            copy_source_dir(source, dest)
        case SourceKind.TARBALL:
            safe_extract_tar(source, dest)
        case SourceKind.GIT:
            return _export_git(source, ref, dest, progress)
        case _:
            assert_never(kind)
    return None


def _is_within(path: Path, directory: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def _source_kind(source: Path, *, ref: str | None, git: bool) -> SourceKind:
    if not os.path.lexists(source):
        raise SourceError(f"{source} does not exist")
    if git or ref is not None:
        if not source.is_dir():
            raise SourceError(f"{source} is not a directory, so it cannot be a git repository")
        return SourceKind.GIT
    if source.is_dir():
        return SourceKind.DIRECTORY
    if source.is_file() and tarfile.is_tarfile(source):
        return SourceKind.TARBALL
    raise SourceError(
        f"{source} is not a directory, a git repository or a tar archive "
        "(.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)"
    )


def _stage_into(tmp: Path, source: Path, kind: SourceKind, ref: str | None,
                job: _Job) -> StagedBuild:
    app, progress, builder = job.app, job.progress, job.builder
    app_dir = tmp.parent
    progress(f"staging {app} from {kind.value} {source}")
    commit = unpack(kind, source, ref, tmp, progress)
    progress("checking the manifest")
    manifest = load_manifest(tmp)
    digest = content_digest(tmp)
    final = build_dir(app_dir.parent, app, digest)
    if final.is_dir():
        progress(f"build {digest[:12]} is already staged; reusing it")
        remove_tree(tmp)
        return StagedBuild(app=app, digest=digest, path=final, manifest=manifest, reused=True,
                           commit=commit)

    limits = _limits_of(manifest, job.limits)
    progress(f"building {digest[:12]}")
    if builder is not None:
        identity.open_app_builds(app_dir, builder.gid)
        identity.own_tree(tmp, builder)  # its steps write there, and nowhere else
    _build(tmp, final, manifest, digest, job, limits)
    progress("sealing the build")
    seal(tmp)
    if builder is not None:
        identity.share_with_group(tmp, builder.gid)
    fsync_tree(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        # another staging of the same source won the race: its build is complete
        remove_tree(tmp)
        return StagedBuild(app=app, digest=digest, path=final, manifest=manifest, reused=True,
                           commit=commit)
    fsync_dir(app_dir)
    progress(f"staged {app} build {digest[:12]}")
    return StagedBuild(app=app, digest=digest, path=final, manifest=manifest, reused=False,
                       commit=commit)


def _export_git(repo: Path, ref: str | None, dest: Path, progress: Progress) -> str:
    """Export `ref` (default HEAD) of `repo` with `git archive`, then safe-extract it;
    returns the commit exported."""
    spec = "HEAD" if ref is None else ref
    if not spec or spec.startswith("-"):
        raise SourceError(f"git ref {spec!r} is not a valid ref name")
    probe = _git(repo, "rev-parse", "--git-dir")
    if probe.returncode != 0:
        raise SourceError(f"{repo} is not a git repository: {_stderr(probe)}")
    resolved = _git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    if resolved.returncode != 0:
        if ref is None:
            raise SourceError(f"git repository {repo} has no commits yet: commit, then deploy")
        raise SourceError(
            f"git repository {repo} has no commit named {ref!r}; "
            f"`git -C {repo} show-ref` lists its branches and tags"
        )
    commit = resolved.stdout.decode().strip()
    progress(f"exporting git {spec} ({commit[:12]})")
    fd, tar_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tar", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            exported = _git(repo, "archive", "--format=tar", commit, stdout=out)
        if exported.returncode != 0:
            raise SourceError(f"git archive of {commit} in {repo} failed: {_stderr(exported)}")
        safe_extract_tar(Path(tar_name), dest)
    finally:
        os.unlink(tar_name)
    return commit


def _git(
    repo: Path, *args: str, stdout: int | IO[bytes] = subprocess.PIPE
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROPPED}
    env["GIT_TERMINAL_PROMPT"] = "0"
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
        )
    except FileNotFoundError as exc:
        raise StagingError("the `git` command is not installed on this box") from exc


def _stderr(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode(errors="replace").strip() or f"exit code {result.returncode}"


def _limits_of(manifest: Manifest, box: BuildLimits) -> BuildLimits:
    """The app's build limits over the box's; ManifestError when it asks for more than
    the box allows: the operator's limit is a ceiling, as a platform's is."""
    above = manifest.build_limits.above(box)
    if above:
        raise ManifestError(
            f"{CONFIG_FILE} [build]: {'; '.join(above)}; ask for at most that, or ask the "
            "operator to raise it (keelway up --build-memory, --build-timeout, "
            "--build-disk)")
    return manifest.build_limits.over(box)


def _build(tmp: Path, final: Path, manifest: Manifest, digest: str, job: _Job,
           limits: BuildLimits) -> None:
    """Run the build steps in `tmp` under `limits`: the dependencies
    keelway/builds/deps.py detects (from the cache when their key matches), then the
    [build] command. The time limit starts here, with the first step."""
    started = time.monotonic()
    app, progress, builder = job.app, job.progress, job.builder
    python = deps.check(tmp, tenants_reach=builder is not None, progress=progress)
    venv = tmp / deps.VENV_DIR
    env = build_env(tmp, venv if python is not None else None, app=app, digest=digest)
    if builder is not None:
        env["HOME"] = str(tmp)  # root's home is not the builder's to write
    # Tools' own caches (npm's, uv's) go outside the tree, so none is sealed into the
    # build; a crash leaves it as a `.tmp-` entry of builds/<app> for `sweep`.
    scratch = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=tmp.parent))
    if builder is not None:
        os.chown(scratch, builder.uid, builder.gid)
    log_fd = os.open(tmp / BUILD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with os.fdopen(log_fd, "ab") as log:
            timeout_s = limits.timeout_s if limits.timeout_s is not None else BUILD_TIMEOUT_S
            step_limits = StepLimits(deadline=started + timeout_s, timeout_s=timeout_s,
                                     memory=limits.memory, disk=limits.disk,
                                     watched=(tmp, scratch), confine=job.confine)
            ctx = deps.Context(tree=tmp, env=env, log=log, progress=progress,
                               limits=step_limits, builder=builder, cache=job.cache,
                               app=app, scratch=scratch)
            if python is not None:
                deps.install_python(ctx, python)
            if deps.wants_node(tmp):
                deps.install_node(ctx, run_build_script=manifest.build_command is None)
            if manifest.build_command is not None:
                progress(f"running the build command: {manifest.build_command}")
                ctx.step(["sh", "-c", manifest.build_command], "the [build] command")
    finally:
        remove_tree(scratch)
    if python is not None:
        deps.relocate_venv(venv, tmp, final)


def sweep(builds_dir: Path) -> list[Path]:
    """Remove `.tmp-*` leftovers of crashed stagings; returns what was removed.

    Call at control-plane boot, before any staging can be running: a live staging's
    temp dir looks exactly like a crashed one.
    """
    removed: list[Path] = []
    builds_dir = Path(builds_dir)
    if not builds_dir.is_dir():
        return removed
    for app_dir in sorted(builds_dir.iterdir()):
        if app_dir.name.startswith(TEMP_PREFIX):
            remove_tree(app_dir)
            removed.append(app_dir)
            continue
        if not app_dir.is_dir() or app_dir.is_symlink():
            continue
        for entry in sorted(app_dir.iterdir()):
            if entry.name.startswith(TEMP_PREFIX):
                remove_tree(entry)
                removed.append(entry)
        if removed:
            fsync_dir(app_dir)
    return removed
