"""A staging previewed: what `stage` would make of a source, without making it.

Owns the read-only half of a staging, for `deploy --dry-run`: the digest the build
would be named by, whether a build of that digest is staged already (then it is
reused, and nothing would be built), and otherwise what building it would install.

Invariants:
- Nothing is written under `builds_dir` (nor anywhere in keelway's home): no build
  directory, no `.tmp-` staging, no dependency-cache entry. A directory source is read
  in place (`tree.source_digest`); a tarball or a git ref is unpacked into a private
  temporary directory outside the home, removed before return.
- The same checks, in the same order, with the same errors as `stage`: the app name and
  the source's kind (`stage.checked_source`), the tree's entries, then the manifest,
  then the toolchain the build would ask for. A source `stage` refuses, `preview`
  refuses with the same BuildError, so a dry run says what the deploy would say.
- The digest is the one `stage` names the build by: the same ignore rules, the same
  records (keelway/builds/tree.py), whichever way the tree is read.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from keelway.builds import deps, tree
from keelway.builds.build_step import Progress
from keelway.builds.errors import StagingError
from keelway.builds.manifest import Manifest, load_manifest
from keelway.builds.stage import SourceKind, build_dir, checked_source, unpack


@dataclass(frozen=True, slots=True)
class BuildPreview:
    """The build a staging of `source` would give `app`: named `digest`, at `path`
    (staged there already when `reused`), with `manifest`; `installs` says what
    building it would run, in order (empty when reused)."""

    app: str
    digest: str
    path: Path
    manifest: Manifest
    reused: bool
    source: str
    installs: tuple[str, ...] = ()
    commit: str | None = None

    def line(self) -> str:
        """The build as `deploy --dry-run` prints it: one line."""
        said = f"build {self.digest[:12]} of {self.source}"
        if self.reused:
            return f"{said}: staged already, reused ({self.path})"
        return f"{said}: would be built ({', '.join(self.installs) or 'nothing to install'})"

    def as_json(self) -> dict[str, object]:
        return {"digest": self.digest, "path": str(self.path), "reused": self.reused,
                "source": self.source, "commit": self.commit,
                "installs": list(self.installs)}


def _quiet(_message: str) -> None:
    pass


def preview(source: Path, *, builds_dir: Path, app: str, ref: str | None = None,
            git: bool = False, tenants_reach: bool = False,
            progress: Progress = _quiet) -> BuildPreview:
    """What `stage(source, builds_dir=..., app=..., ref=..., git=...)` would stage,
    read only (see the module header). `tenants_reach`: the build runs as the app's
    builder, so its Python must be one a tenant's uid can run. Raises the BuildError
    `stage` would raise for this source."""
    source = Path(source)
    try:
        return _preview(source, builds_dir, app, ref, git, tenants_reach, progress)
    except OSError as exc:
        raise StagingError(f"stage {app} from {source}: {exc}") from exc


def _preview(source: Path, builds_dir: Path, app: str, ref: str | None, git: bool,
             tenants_reach: bool, progress: Progress) -> BuildPreview:
    kind = checked_source(source, builds_dir=builds_dir, app=app, ref=ref, git=git)
    if kind is SourceKind.DIRECTORY:
        digest = tree.source_digest(source)
        return _previewed(source, app, digest, builds_dir, f"directory {source}", None,
                          tenants_reach, progress)
    with tempfile.TemporaryDirectory(prefix="keelway-preview-") as scratch:
        unpacked = Path(scratch) / "tree"
        unpacked.mkdir(mode=0o700)
        commit = unpack(kind, source, ref, unpacked, progress)
        digest = tree.content_digest(unpacked)
        said = (f"git {ref or 'HEAD'} ({commit[:12]}) of {source}" if commit is not None
                else f"{kind.value} {source}")
        return _previewed(unpacked, app, digest, builds_dir, said, commit, tenants_reach,
                          progress)


def _previewed(files: Path, app: str, digest: str, builds_dir: Path, source: str,
               commit: str | None, tenants_reach: bool, progress: Progress) -> BuildPreview:
    manifest = load_manifest(files)
    path = build_dir(builds_dir, app, digest)
    if path.is_dir():
        return BuildPreview(app, digest, path, manifest, True, source, commit=commit)
    python = deps.check(files, tenants_reach=tenants_reach, progress=progress)
    installs: list[str] = []
    if python is not None:
        installs.append(f"a Python {python.version_text} venv by "
                        f"{deps.python_installer(files)}")
    if deps.wants_node(files):
        lockfile = deps.node_lockfile(files)
        installs.append("node modules by " + ("npm ci" if lockfile else "npm install"))
    if manifest.build_command is not None:
        installs.append(f"the [build] command `{manifest.build_command}`")
    return BuildPreview(app, digest, path, manifest, False, source, tuple(installs),
                        commit)
