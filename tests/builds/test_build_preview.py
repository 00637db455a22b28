"""A staging previewed: the digest `stage` would name the build by, whether that build is
staged already, what building it would install, and the same refusals as `stage`, all
without writing anything."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import BuildError, ManifestError, SourceError
from keelway.builds.preview import preview
from keelway.builds.stage import stage

MakeApp = Callable[..., Path]
Git = Callable[..., str]


def _tree(root: Path) -> list[tuple[str, int]]:
    """Every path under `root` with its mode: what a preview must leave as it was."""
    if not root.exists():
        return []
    return sorted((str(Path(d, n).relative_to(root)), os.lstat(Path(d, n)).st_mode)
                  for d, ds, fs in os.walk(root) for n in (*ds, *fs))


def _app(make_app: MakeApp) -> Path:
    app = make_app(files={"app.py": "print('hi')\n", "lib/x.py": "X = 1\n",
                          "notes.tmp": "left out\n", ".keelwayignore": "*.tmp\n",
                          "__pycache__/x.pyc": "cached\n", "bin/run": "#!/bin/sh\n"})
    (app / "bin/run").chmod(0o755)
    os.symlink("lib/x.py", app / "x-link.py")
    return app


def test_a_directory_previews_the_digest_stage_names_its_build_by_and_writes_nothing(
        make_app: MakeApp, builds_dir: Path, tmp_path: Path) -> None:
    app = _app(make_app)
    before = _tree(tmp_path)
    seen = preview(app, builds_dir=builds_dir, app="demo")
    assert _tree(tmp_path) == before and not builds_dir.exists()
    assert not seen.reused and seen.path == builds_dir / "demo" / seen.digest
    staged = stage(app, builds_dir=builds_dir, app="demo")
    assert seen.digest == staged.digest and seen.manifest == staged.manifest
    assert seen.line() == (f"build {seen.digest[:12]} of directory {app}: would be built "
                           "(nothing to install)")


def test_a_staged_digest_previews_as_reused(make_app: MakeApp, builds_dir: Path) -> None:
    app = _app(make_app)
    staged = stage(app, builds_dir=builds_dir, app="demo")
    before = _tree(builds_dir)
    seen = preview(app, builds_dir=builds_dir, app="demo")
    assert seen.reused and seen.path == staged.path and _tree(builds_dir) == before
    assert seen.line().endswith(f"staged already, reused ({staged.path})")


def test_a_tarball_and_a_git_ref_preview_the_digest_of_their_staging(
        make_app: MakeApp, builds_dir: Path, tmp_path: Path, git: Git) -> None:
    app = _app(make_app)
    tarball = tmp_path / "app.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(app, arcname=".")
    git(app, "init", "-q")
    git(app, "add", "-A")
    git(app, "commit", "-qm", "one")
    from_tar = preview(tarball, builds_dir=builds_dir, app="demo")
    from_git = preview(app, builds_dir=builds_dir, app="demo", git=True)
    assert not builds_dir.exists()
    assert from_tar.digest == stage(tarball, builds_dir=builds_dir, app="demo").digest
    staged = stage(app, builds_dir=builds_dir, app="demo", git=True)
    assert from_git.digest == staged.digest and from_git.commit == staged.commit
    assert from_git.source.startswith(f"git HEAD ({staged.commit[:12]}) of ")


def test_what_a_build_would_install_is_said_from_the_apps_files(
        make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(files={"requirements.txt": "\n"},
                   toml='[build]\ncommand = "echo built"\n')
    seen = preview(app, builds_dir=builds_dir, app="demo")
    assert seen.installs[0].startswith("a Python 3.")
    assert seen.installs[0].endswith(" venv by pip-requirements")
    assert seen.installs[1:] == ("the [build] command `echo built`",)


@pytest.mark.parametrize("broken", ["manifest", "missing", "name", "link"])
def test_a_preview_refuses_what_stage_refuses_with_the_same_error(
        make_app: MakeApp, builds_dir: Path, tmp_path: Path, broken: str) -> None:
    app = make_app(toml="[services.web]\nmode = 'sideways'\n" if broken == "manifest"
                   else None)
    name = "Bad Name" if broken == "name" else "demo"
    source = tmp_path / "nowhere" if broken == "missing" else app
    if broken == "link":
        os.symlink("/etc/hostname", app / "outside")
    kind = ManifestError if broken == "manifest" else SourceError
    with pytest.raises(kind) as previewed:
        preview(source, builds_dir=builds_dir, app=name)
    with pytest.raises(BuildError) as staged:
        stage(source, builds_dir=builds_dir, app=name)
    assert str(previewed.value) == str(staged.value)
    assert not (builds_dir / name).exists() or not os.listdir(builds_dir / name)
