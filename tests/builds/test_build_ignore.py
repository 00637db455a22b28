"""What a build leaves out: the default ignores and `.keelwayignore`, the same for a
directory, a tarball and a git export of one tree."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import SourceError
from keelway.builds.ignore import MAX_IGNORE_FILE_BYTES, IgnoreRules
from keelway.builds.stage import stage

MakeApp = Callable[..., Path]
Git = Callable[..., str]

SECRETS = {
    ".env": "DATABASE_PASSWORD=hunter2\n",
    "config/.env": "API_TOKEN=t0k3n\n",
    "node_modules/left-pad/index.js": "module.exports = 1\n",
    ".venv/bin/python": "#!/bin/false\n",
    "pkg/__pycache__/m.cpython-311.pyc": "junk",
    ".git/config": "[credential]\n",
}


def files_of(root: Path) -> set[str]:
    """Every file or link of a build but the log of its build steps."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if not p.is_dir() or p.is_symlink()} - {".keelway-build.log"}


def tarball_of(app: Path, path: Path, top: str = "app-1.0") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(app, arcname=top)
    return path


# the rules themselves


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "ignored"),
    [
        ("*.log", "debug.log", False, True),
        ("*.log", "deep/down/debug.log", False, True),
        ("*.log", "debug.log.txt", False, False),
        ("tmp/", "tmp", True, True),
        ("tmp/", "tmp", False, False),  # a trailing slash: directories only
        ("tmp/", "src/tmp", True, True),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "sub/top.txt", False, False),  # a leading slash anchors at the root
        ("docs/*.md", "docs/a.md", False, True),
        ("docs/*.md", "docs/deeper/a.md", False, False),  # `*` never crosses a `/`
        ("docs/*.md", "other/docs/a.md", False, False),  # a middle slash anchors too
        ("**/fixtures", "a/b/fixtures", True, True),
        ("**/fixtures", "fixtures", True, True),
        ("docs/**/*.md", "docs/a/b/c.md", False, True),
        ("docs/**/*.md", "docs/c.md", False, True),  # `/**/` is zero or more directories
        ("assets/**", "assets/img/a.png", False, True),
        ("assets/**", "assets", True, False),  # everything inside, not the directory
        ("file?.txt", "file1.txt", False, True),
        ("file?.txt", "file10.txt", False, False),
        ("[ab].txt", "a.txt", False, True),
        ("[ab].txt", "c.txt", False, False),
        ("[!ab].txt", "c.txt", False, True),
        ("[a-c].txt", "b.txt", False, True),
        ("\\#notes", "#notes", False, True),
        ("\\!bang", "!bang", False, True),
        ("# a comment", "# a comment", False, False),
    ],
)
def test_a_pattern_matches_as_it_would_in_a_gitignore(
    pattern: str, path: str, is_dir: bool, ignored: bool
) -> None:
    assert IgnoreRules.parse(pattern).ignored(path, is_dir=is_dir) is ignored


def test_the_last_matching_line_wins_so_a_negation_keeps_a_file() -> None:
    rules = IgnoreRules.parse("*.log\n!keep.log\n")
    assert rules.ignored("a.log", is_dir=False)
    assert not rules.ignored("keep.log", is_dir=False)
    assert not rules.ignored("sub/keep.log", is_dir=False)
    assert IgnoreRules.parse("!keep.log\n*.log\n").ignored("keep.log", is_dir=False)


def test_the_defaults_apply_with_no_file_and_a_negation_can_keep_one_but_never_git() -> None:
    defaults = IgnoreRules.parse()
    for name, is_dir in ((".env", False), ("a/.env", False), (".venv", True),
                         ("web/node_modules", True), ("pkg/__pycache__", True),
                         (".git", True), ("sub/.git", False), (".keelway-build.log", False)):
        assert defaults.ignored(name, is_dir=is_dir), name
    assert not defaults.ignored("sub/.keelway-build.log", is_dir=False)  # only ours, at top
    assert not defaults.ignored(".env.example", is_dir=False)
    kept = IgnoreRules.parse("!node_modules\n!.git\n")
    assert not kept.ignored("node_modules", is_dir=True)
    assert kept.ignored(".git", is_dir=True)


def test_nothing_below_a_left_out_directory_can_be_kept_again() -> None:
    rules = IgnoreRules.parse("vendor/\n!vendor/keep.txt\n")
    assert rules.ignored_below("vendor/keep.txt", is_dir=False)
    assert not rules.ignored_below("src/keep.txt", is_dir=False)


def test_an_unreadable_pattern_is_refused_naming_its_line() -> None:
    never_closed = r"\.keelwayignore line 2: 'bad\[' opens a '\[' it never closes"
    with pytest.raises(SourceError, match=never_closed):
        IgnoreRules.parse("ok\nbad[\n")
    with pytest.raises(SourceError, match=r"line 1: '/' has no name"):
        IgnoreRules.parse("/\n")
    with pytest.raises(SourceError, match="not UTF-8"):
        IgnoreRules.from_file(b"\xff\xfe\n")
    with pytest.raises(SourceError, match="is over"):
        IgnoreRules.from_file(b"#" * (MAX_IGNORE_FILE_BYTES + 1))


# staging with them


def test_a_directory_deploy_leaves_local_secrets_and_dependencies_out_of_the_build(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(files={"app.py": "x\n", **SECRETS})
    plain = make_app(name="plain", files={"app.py": "x\n"})
    (plain / "config").mkdir()  # what is left of the dirs that held only left-out entries
    (plain / "pkg").mkdir()
    build = stage(app, builds_dir=builds_dir, app="demo")
    assert files_of(build.path) == {"Procfile", "app.py"}
    assert build.digest == stage(plain, builds_dir=builds_dir, app="demo").digest


def test_a_keelwayignore_leaves_out_what_it_names_and_keeps_what_it_negates(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(files={
        "app.py": "x\n",
        ".keelwayignore": "# local only\n*.log\n!release.log\n/scratch/\ndocs/**/*.md\n",
        "debug.log": "d", "release.log": "r", "sub/trace.log": "t",
        "scratch/notes.txt": "n", "lib/scratch/kept.txt": "k",
        "docs/a/b/c.md": "m", "docs/index.html": "h",
    })
    build = stage(app, builds_dir=builds_dir, app="demo")
    assert files_of(build.path) == {
        "Procfile", "app.py", ".keelwayignore", "release.log", "lib/scratch/kept.txt",
        "docs/index.html",
    }


def test_a_directory_and_a_tarball_of_the_same_tree_give_one_digest_with_ignores_applied(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    app = make_app(files={
        "app.py": "x\n", "bin/run": "#!/bin/sh\n", ".keelwayignore": "*.log\ncache/\n",
        "x.log": "l", "cache/blob": "b", "static/a.css": "a{}\n", **SECRETS,
    })
    os.chmod(app / "bin/run", 0o755)
    os.symlink("static/a.css", app / "main.css")
    from_dir = stage(app, builds_dir=builds_dir, app="demo")
    from_tar = stage(tarball_of(app, tmp_path / "app.tgz"), builds_dir=builds_dir, app="other")
    assert from_tar.digest == from_dir.digest
    assert files_of(from_tar.path) == files_of(from_dir.path) == {
        "Procfile", "app.py", "bin/run", ".keelwayignore", "static/a.css", "main.css"}


def test_a_git_export_applies_the_same_ignores_as_a_directory(
    make_app: MakeApp, builds_dir: Path, git: Git
) -> None:
    app = make_app(files={"app.py": "x\n", ".keelwayignore": "*.log\n", "x.log": "l",
                          ".env": "SECRET=1\n", "node_modules/m.js": "m"})
    git(app, "init", "-q")
    git(app, "add", "-A", "-f")  # .env and node_modules committed, as careless repos do
    git(app, "commit", "-q", "-m", "all")
    from_git = stage(app, builds_dir=builds_dir, app="demo", git=True)
    assert files_of(from_git.path) == {"Procfile", "app.py", ".keelwayignore"}
    assert from_git.digest == stage(app, builds_dir=builds_dir, app="other").digest


def test_a_kept_hard_link_to_a_left_out_file_in_a_tarball_is_staged_as_a_copy(
    builds_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("Procfile", b"web: python -m http.server $PORT\n"),
                           ("secret.log", b"shared bytes\n"), (".keelwayignore", b"*.log\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("kept.txt")
        link.type = tarfile.LNKTYPE
        link.linkname = "secret.log"
        tar.addfile(link)
    build = stage(path, builds_dir=builds_dir, app="demo")
    assert files_of(build.path) == {"Procfile", ".keelwayignore", "kept.txt"}
    assert (build.path / "kept.txt").read_bytes() == b"shared bytes\n"


def test_a_keelwayignore_that_is_a_symlink_is_refused(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    app = make_app()
    (tmp_path / "elsewhere").write_text("*.py\n")
    os.symlink(tmp_path / "elsewhere", app / ".keelwayignore")
    with pytest.raises(SourceError, match="must be a regular file"):
        stage(app, builds_dir=builds_dir, app="demo")
    assert not (builds_dir / "demo").exists() or list((builds_dir / "demo").iterdir()) == []


def test_nothing_in_a_staged_build_is_readable_by_group_or_other(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    app = make_app(files={"app.py": "x\n", "bin/run": "#!/bin/sh\n", "lib/m.py": "m\n"})
    os.chmod(app / "bin/run", 0o755)
    old_umask = os.umask(0o022)  # what an operator's shell has; the build must not care
    try:
        builds = [stage(app, builds_dir=builds_dir, app="demo"),
                  stage(tarball_of(app, tmp_path / "a.tgz"), builds_dir=builds_dir, app="t")]
    finally:
        os.umask(old_umask)
    for build in builds:
        for path in [build.path.parent, build.path, *build.path.rglob("*")]:
            assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0 or path.is_symlink(), path
        assert stat.S_IMODE((build.path / "bin/run").stat().st_mode) == 0o500  # sealed
