"""Staging from directories, tarballs and git refs; build steps; digests; sweep."""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import BuildCommandError, ManifestError, SourceError
from keelway.builds.stage import stage, sweep
from keelway.limits import TENANT_OOM_SCORE, BuildLimits

MakeApp = Callable[..., Path]
Git = Callable[..., str]


def named(builds_dir: Path, app: str = "demo") -> list[str]:
    """Every entry under builds/<app>: digests, temps, anything."""
    app_dir = builds_dir / app
    return sorted(p.name for p in app_dir.iterdir()) if app_dir.exists() else []


def test_staging_a_directory_twice_gives_the_same_digest_and_reuses_the_build(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(files={"app.py": "print('hi')\n", "lib/x.py": "X = 1\n"})
    first = stage(app, builds_dir=builds_dir, app="demo")
    second = stage(app, builds_dir=builds_dir, app="demo")
    assert (first.reused, second.reused) == (False, True)
    assert first.digest == second.digest
    assert first.path == second.path == builds_dir / "demo" / first.digest
    assert named(builds_dir) == [first.digest]
    assert (first.path / "lib/x.py").read_text() == "X = 1\n"
    assert first.manifest == second.manifest
    assert first.manifest.services["web"].command.startswith("python -m http.server")


def test_changing_one_byte_changes_the_digest(make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(files={"app.py": "print('hi')\n"})
    before = stage(app, builds_dir=builds_dir, app="demo").digest
    (app / "app.py").write_text("print('ho')\n")
    assert stage(app, builds_dir=builds_dir, app="demo").digest != before


def test_the_executable_bit_is_part_of_the_digest_but_mtime_is_not(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(files={"run.sh": "echo hi\n"})
    before = stage(app, builds_dir=builds_dir, app="demo").digest
    os.utime(app / "run.sh", (1, 1))
    assert stage(app, builds_dir=builds_dir, app="demo").digest == before
    os.chmod(app / "run.sh", 0o755)
    assert stage(app, builds_dir=builds_dir, app="demo").digest != before


def test_git_metadata_caches_and_local_venvs_are_not_staged(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(
        files={
            "app.py": "x\n",
            ".git/HEAD": "ref\n",
            "pkg/__pycache__/m.pyc": "junk",
            ".venv/bin/python": "junk",
            "pkg/m.py": "y\n",
        }
    )
    plain = make_app(name="plain", files={"app.py": "x\n", "pkg/m.py": "y\n"})
    build = stage(app, builds_dir=builds_dir, app="demo")
    assert not (build.path / ".git").exists()
    assert not (build.path / "pkg/__pycache__").exists()
    assert build.digest == stage(plain, builds_dir=builds_dir, app="demo").digest


def test_a_tarball_of_a_directory_stages_to_the_directorys_digest(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    app = make_app(files={"app.py": "x\n", "static/a.css": "a{}\n"})
    os.symlink("static/a.css", app / "main.css")
    with tarfile.open(tmp_path / "app.tgz", "w:gz") as tar:
        tar.add(app, arcname="app-1.0")
    from_dir = stage(app, builds_dir=builds_dir, app="demo")
    from_tar = stage(tmp_path / "app.tgz", builds_dir=builds_dir, app="demo")
    assert from_tar.digest == from_dir.digest
    assert from_tar.reused


def test_a_directory_symlink_out_of_the_app_is_refused(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    app = make_app()
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", app / "config")
    with pytest.raises(SourceError, match=r"config is a symlink.*outside the app"):
        stage(app, builds_dir=builds_dir, app="demo")
    assert named(builds_dir) == []


def test_a_staged_build_is_sealed_read_only(make_app: MakeApp, builds_dir: Path) -> None:
    build = stage(make_app(files={"lib/x.py": "X\n"}), builds_dir=builds_dir, app="demo")
    for path in [build.path, build.path / "lib", build.path / "lib/x.py", build.path / "Procfile"]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0, path


def test_a_bad_manifest_fails_before_anything_is_named(make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(procfile="worker: python w.py\n", toml='[build]\ncommand = "touch ran"\n')
    with pytest.raises(ManifestError, match="no `web` process"):
        stage(app, builds_dir=builds_dir, app="demo")
    assert named(builds_dir) == []
    assert not (app / "ran").exists()


def test_a_missing_source_is_refused(builds_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        stage(tmp_path / "nope", builds_dir=builds_dir, app="demo")


@pytest.mark.parametrize("app_name", ["../evil", "Demo", "", ".tmp-x", "a/b"])
def test_an_unsafe_app_name_is_refused(make_app: MakeApp, builds_dir: Path, app_name: str) -> None:
    with pytest.raises(SourceError, match="app name"):
        stage(make_app(), builds_dir=builds_dir, app=app_name)
    assert not builds_dir.exists()


def test_the_build_command_runs_in_the_build_and_its_output_is_captured(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(
        toml='[build]\ncommand = "echo compiled > out.txt; echo to-stdout; '
        'echo to-stderr >&2; echo $KEELWAY_APP"\n'
    )
    lines: list[str] = []
    build = stage(app, builds_dir=builds_dir, app="demo", progress=lines.append)
    assert (build.path / "out.txt").read_text() == "compiled\n"
    log = (build.path / ".keelway-build.log").read_text()
    assert "to-stdout\nto-stderr\ndemo\n" in log
    assert "| to-stderr" in lines
    assert any(line.startswith("running the build command") for line in lines)
    assert lines[-1].startswith("staged demo build")
    assert not (app / "out.txt").exists()


def test_build_outputs_do_not_change_the_digest_so_a_rebuild_is_reused(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(toml='[build]\ncommand = "date +%N > stamp"\n')
    first = stage(app, builds_dir=builds_dir, app="demo")
    second = stage(app, builds_dir=builds_dir, app="demo")
    assert second.reused
    assert (second.path / "stamp").read_text() == (first.path / "stamp").read_text()


def test_a_failing_build_command_reports_its_last_lines_and_leaves_nothing_named(
    make_app: MakeApp, builds_dir: Path
) -> None:
    command = "for i in $(seq 1 30); do echo line-$i; done; exit 3"
    app = make_app(toml=f'[build]\ncommand = "{command}"\n')
    with pytest.raises(BuildCommandError, match="exit code 3") as caught:
        stage(app, builds_dir=builds_dir, app="demo")
    assert caught.value.tail == [f"line-{i}" for i in range(11, 31)]
    assert "line-30" in str(caught.value)
    assert named(builds_dir) == []


def test_a_build_command_past_its_time_is_killed_with_its_children(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(toml='[build]\ncommand = "echo waiting; sleep 30 & sleep 30"\n')
    started = time.monotonic()
    with pytest.raises(BuildCommandError, match=r"took longer than its 0\.5s limit"):
        stage(app, builds_dir=builds_dir, app="demo", limits=BuildLimits(timeout_s=0.5))
    assert time.monotonic() - started < 10
    assert named(builds_dir) == []


def test_a_background_process_left_by_the_build_is_killed_not_waited_for(
    make_app: MakeApp, builds_dir: Path, tmp_path: Path
) -> None:
    pidfile = tmp_path / "leftover.pid"
    app = make_app(toml=f'[build]\ncommand = "sleep 60 & echo $! > {pidfile}"\n')
    started = time.monotonic()
    stage(app, builds_dir=builds_dir, app="demo")
    assert time.monotonic() - started < 10
    assert process_state(int(pidfile.read_text())) in ("gone", "Z")


def process_state(pid: int) -> str:
    """'gone', or the /proc state letter ('Z': dead, waiting for its reaper)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat_line.rsplit(")", 1)[1].split()[0]


def test_the_build_does_not_see_the_control_planes_environment(
    make_app: MakeApp, builds_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEELWAY_API_TOKEN", "secret")
    app = make_app(toml='[build]\ncommand = "echo token=${KEELWAY_API_TOKEN:-none} > env.txt"\n')
    build = stage(app, builds_dir=builds_dir, app="demo")
    assert (build.path / "env.txt").read_text() == "token=none\n"


def test_sweep_removes_temp_leftovers_and_keeps_builds(make_app: MakeApp, builds_dir: Path) -> None:
    build = stage(make_app(), builds_dir=builds_dir, app="demo")
    crashed = builds_dir / "demo" / ".tmp-abc123"
    (crashed / "sub").mkdir(parents=True)
    (crashed / "sub/file").write_text("x")
    os.chmod(crashed / "sub", 0o555)  # a crash after sealing, before the rename
    (builds_dir / "demo" / ".tmp-export.tar").write_bytes(b"x")
    removed = sweep(builds_dir)
    assert sorted(p.name for p in removed) == [".tmp-abc123", ".tmp-export.tar"]
    assert named(builds_dir) == [build.digest]


def test_sweep_of_a_missing_builds_dir_removes_nothing(tmp_path: Path) -> None:
    assert sweep(tmp_path / "nope") == []


# git sources


@pytest.fixture
def repo(tmp_path: Path, git: Git) -> Path:
    """A repository with two commits: v1 (tagged) then v2 on main."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "Procfile").write_text("web: python app.py\n")
    (root / "app.py").write_text("VERSION = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "v1")
    git(root, "tag", "v1")
    (root / "app.py").write_text("VERSION = 2\n")
    git(root, "commit", "-q", "-am", "v2")
    (root / "app.py").write_text("VERSION = 'uncommitted'\n")
    return root


def test_git_head_exports_the_last_commit_not_the_working_tree(
    repo: Path, builds_dir: Path
) -> None:
    build = stage(repo, builds_dir=builds_dir, app="demo", git=True)
    assert (build.path / "app.py").read_text() == "VERSION = 2\n"
    assert not (build.path / ".git").exists()
    assert [p.name for p in (builds_dir / "demo").iterdir()] == [build.digest]


def test_a_named_ref_exports_that_commit(repo: Path, builds_dir: Path, git: Git) -> None:
    by_tag = stage(repo, builds_dir=builds_dir, app="demo", ref="v1")
    by_sha = stage(repo, builds_dir=builds_dir, app="demo", ref=git(repo, "rev-parse", "v1"))
    head = stage(repo, builds_dir=builds_dir, app="demo", ref="main")
    assert (by_tag.path / "app.py").read_text() == "VERSION = 1\n"
    assert by_sha.digest == by_tag.digest and by_sha.reused
    assert head.digest != by_tag.digest


def test_git_export_and_directory_copy_of_the_same_content_share_a_digest(
    repo: Path, builds_dir: Path, git: Git
) -> None:
    git(repo, "checkout", "-q", "--", "app.py")
    assert (
        stage(repo, builds_dir=builds_dir, app="demo", git=True).digest
        == stage(repo, builds_dir=builds_dir, app="demo").digest
    )


def test_an_unknown_ref_is_refused_saying_how_to_list_refs(repo: Path, builds_dir: Path) -> None:
    with pytest.raises(SourceError, match=r"no commit named 'nope'.*show-ref"):
        stage(repo, builds_dir=builds_dir, app="demo", ref="nope")
    assert named(builds_dir) == []


def test_a_ref_that_looks_like_an_option_is_refused(repo: Path, builds_dir: Path) -> None:
    with pytest.raises(SourceError, match="not a valid ref name"):
        stage(repo, builds_dir=builds_dir, app="demo", ref="--output=/tmp/x")


def test_a_directory_that_is_not_a_git_repository_is_refused_for_git(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app()
    with pytest.raises(SourceError, match="is not a git repository"):
        stage(app, builds_dir=builds_dir, app="demo", git=True)
    assert named(builds_dir) == []


def test_a_repository_without_commits_is_refused(
    tmp_path: Path, builds_dir: Path, git: Git
) -> None:
    (tmp_path / "empty").mkdir()
    git(tmp_path / "empty", "init", "-q")
    with pytest.raises(SourceError, match="has no commits yet"):
        stage(tmp_path / "empty", builds_dir=builds_dir, app="demo", git=True)


# requirements.txt: a venv inside the build


@pytest.mark.slow
def test_an_app_with_requirements_gets_a_venv_inside_its_build(
    make_app: MakeApp, builds_dir: Path
) -> None:
    app = make_app(
        files={"requirements.txt": "# nothing to install\n"},
        toml="[build]\ncommand = \"python -c 'import sys; print(sys.prefix)' > prefix.txt\"\n",
    )
    lines: list[str] = []
    build = stage(app, builds_dir=builds_dir, app="demo", progress=lines.append)
    venv = build.path / ".venv"
    assert (venv / "bin/python").exists()
    assert "requirements.txt lists nothing to install" in lines
    # the build command ran with the venv first on PATH
    assert (build.path / "prefix.txt").read_text().strip().endswith(".venv")
    # the venv's scripts name the final path, not the temp dir they were built in
    pip_shebang = (venv / "bin/pip").read_text().splitlines()[0]
    assert pip_shebang.startswith(f"#!{venv}/bin/python")
    result = subprocess.run([str(venv / "bin/pip"), "--version"], capture_output=True, check=False)
    assert result.returncode == 0, result.stderr


def test_staging_a_directory_that_contains_the_builds_dir_is_refused(make_app: MakeApp) -> None:
    app = make_app()
    with pytest.raises(SourceError, match="is inside the source"):
        stage(app, builds_dir=app / "state" / "builds", app="demo")


def test_a_build_step_runs_with_a_tenants_oom_score_not_the_control_planes(
    make_app: MakeApp, builds_dir: Path
) -> None:
    """Out of memory, a runaway build is killed like an app, before keelway: it does not
    keep the low score the control plane gives itself (keelway/limits.py)."""
    app = make_app(toml='[build]\ncommand = "cat /proc/self/oom_score_adj > score.txt"\n')
    staged = stage(app, builds_dir=builds_dir, app="demo")
    assert (staged.path / "score.txt").read_text().strip() == str(TENANT_OOM_SCORE)
