"""`[build] memory`, `timeout` and `disk` in keelway.toml (keelway/limits.py BuildLimits):
read as people write them, unset ones left to the box, bad ones refused naming where,
and the box's limits a ceiling that staging holds an app to before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import load_manifest
from keelway.builds.stage import stage
from keelway.limits import (
    BUILD_DISK,
    BUILD_MEMORY,
    BUILD_TIMEOUT_S,
    MIN_MEMORY,
    BuildLimits,
    LimitError,
    box_build_limits,
    build_memory_default,
)


def _app(tmp_path: Path, toml: str | None) -> Path:
    (tmp_path / "Procfile").write_text("web: python3 -m http.server $PORT\n")
    if toml is not None:
        (tmp_path / "keelway.toml").write_text(toml)
    return tmp_path


def test_a_build_s_limits_are_its_own_and_the_rest_the_box_s(tmp_path: Path) -> None:
    manifest = load_manifest(_app(tmp_path, '[build]\ncommand = "true"\nmemory = "512M"\n'
                                            'timeout = "10m"\ndisk = "1G"\n'))
    assert manifest.build_limits == BuildLimits(512 << 20, 600.0, 1 << 30)
    assert manifest.build_command == "true"
    partial = tmp_path / "partial"
    partial.mkdir()
    assert load_manifest(_app(partial, "[build]\ntimeout = 90\n")).build_limits == (
        BuildLimits(timeout_s=90.0))
    bare = tmp_path / "bare"
    bare.mkdir()
    assert load_manifest(_app(bare, None)).build_limits == BuildLimits()


@pytest.mark.parametrize(("line", "said"), [
    ('memory = "lots"', r"\[build\] memory: 'lots' is not an amount of memory"),
    ('memory = "4M"', r"\[build\] memory: '4M' is below the 16M"),
    ('timeout = "soon"', r"\[build\] timeout: 'soon' is not a duration"),
    ('timeout = "500ms"', r"\[build\] timeout: '500ms' is shorter than the 1s"),
    ("timeout = -5", r"\[build\] timeout: -5.0 must be a finite, non-negative duration"),
    ('disk = "huge"', r"\[build\] disk: 'huge' is not an amount of disk"),
    ('disk = "1M"', r"\[build\] disk: '1M' is below the 16M"),
    ("disk = true", "disk"),
    ('cpu = "1"', "cpu"),  # not a build limit: a typo never silently does nothing
])
def test_a_build_limit_that_cannot_be_taken_is_refused_naming_where(
        tmp_path: Path, line: str, said: str) -> None:
    with pytest.raises(ManifestError, match=said):
        load_manifest(_app(tmp_path, f"[build]\n{line}\n"))


def test_the_box_s_build_limits_default_to_2g_30m_4g_and_less_memory_on_a_small_box() -> None:
    assert box_build_limits(apps_budget=20 << 30) == BuildLimits(BUILD_MEMORY, BUILD_TIMEOUT_S,
                                                                 BUILD_DISK)
    assert box_build_limits().memory == BUILD_MEMORY == 2 << 30
    # a 1G box keeps 512M for keelway; of the 512M its apps share, a build takes half
    assert build_memory_default(512 << 20) == 256 << 20
    assert build_memory_default(1 << 20) == MIN_MEMORY
    given = box_build_limits("1G", "1h", "10G", apps_budget=512 << 20)
    assert given == BuildLimits(1 << 30, 3600.0, 10 << 30)


@pytest.mark.parametrize(("flags", "said"), [
    ({"memory": "1"}, "--build-memory"),
    ({"timeout": "0s"}, "--build-timeout: '0s' is shorter"),
    ({"disk": "x"}, "--build-disk: 'x' is not an amount of disk"),
])
def test_a_box_build_limit_that_cannot_be_taken_is_refused_naming_the_flag(
        flags: dict[str, str], said: str) -> None:
    with pytest.raises(LimitError, match=said):
        box_build_limits(**flags)


def test_an_app_may_ask_for_less_than_the_box_allows_never_more(tmp_path: Path) -> None:
    box = BuildLimits(memory=1 << 30, timeout_s=600.0, disk=2 << 30)
    greedy = tmp_path / "greedy"
    greedy.mkdir()
    _app(greedy, '[build]\ncommand = "touch ran"\nmemory = "2G"\ntimeout = "20m"\n'
                 'disk = "1G"\n')
    with pytest.raises(ManifestError) as refused:
        stage(greedy, builds_dir=tmp_path / "builds", app="greedy", limits=box)
    message = str(refused.value)
    assert "memory 2G is above this box's 1G" in message
    assert "timeout 20m is above this box's 10m" in message
    assert "disk" not in message.split(";")[0]  # asking for less is no error
    assert "--build-memory" in message
    assert list((tmp_path / "builds" / "greedy").iterdir()) == []  # nothing ran, nothing named

    modest = tmp_path / "modest"
    modest.mkdir()
    _app(modest, '[build]\ncommand = "touch ran"\nmemory = "256M"\n')
    built = stage(modest, builds_dir=tmp_path / "builds", app="modest", limits=box)
    assert (built.path / "ran").is_file()
