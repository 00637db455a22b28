"""gc: every staged build nothing pins is removed; pinned ones and temps are kept."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keelway.builds.gc import collect, staged_builds
from keelway.builds.stage import StagedBuild, stage

MakeApp = Callable[..., Path]


def three_builds(make_app: MakeApp, builds_dir: Path) -> list[StagedBuild]:
    builds = []
    for app_name, version in [("blog", "1"), ("blog", "2"), ("shop", "1")]:
        source = make_app(name=f"{app_name}-{version}", files={"v.txt": version})
        builds.append(stage(source, builds_dir=builds_dir, app=app_name))
    return builds


def test_collect_removes_unpinned_builds_and_keeps_pinned_ones(
    make_app: MakeApp, builds_dir: Path
) -> None:
    old, current, shop = three_builds(make_app, builds_dir)
    pinned = {("blog", current.digest), ("shop", shop.digest)}
    assert collect(builds_dir, pinned) == [("blog", old.digest)]
    assert not old.path.exists()
    assert (current.path / "v.txt").read_text() == "2"
    assert staged_builds(builds_dir) == sorted(pinned)
    assert sorted(p.name for p in (builds_dir / "blog").iterdir()) == [current.digest]


def test_a_dry_run_says_what_it_would_remove_and_removes_nothing(
    make_app: MakeApp, builds_dir: Path
) -> None:
    builds = three_builds(make_app, builds_dir)
    doomed = collect(builds_dir, set(), dry_run=True)
    assert doomed == sorted((b.app, b.digest) for b in builds)
    assert all(b.path.is_dir() for b in builds)


def test_collect_never_touches_stagings_in_progress_or_unknown_names(
    make_app: MakeApp, builds_dir: Path
) -> None:
    (build,) = [stage(make_app(), builds_dir=builds_dir, app="blog")]
    in_progress = builds_dir / "blog" / ".tmp-staging"
    in_progress.mkdir()
    stray = builds_dir / "blog" / "notes"
    stray.mkdir()
    assert collect(builds_dir, set()) == [("blog", build.digest)]
    assert sorted(p.name for p in (builds_dir / "blog").iterdir()) == [".tmp-staging", "notes"]


def test_a_collected_build_can_be_staged_again(make_app: MakeApp, builds_dir: Path) -> None:
    source = make_app()
    first = stage(source, builds_dir=builds_dir, app="blog")
    collect(builds_dir, set())
    again = stage(source, builds_dir=builds_dir, app="blog")
    assert (again.digest, again.reused) == (first.digest, False)


def test_collect_in_an_empty_or_missing_builds_dir_removes_nothing(tmp_path: Path) -> None:
    assert collect(tmp_path / "missing", set()) == []
