"""Fixtures for the builds tests: real files in tmp_path, real tar archives, real git."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.cache import DepsCache

WEB_PROCFILE = "web: python -m http.server $PORT\n"


@pytest.fixture
def builds_dir(tmp_path: Path) -> Path:
    return tmp_path / "builds"


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., Path]:
    """Write an app directory: a Procfile, an optional keelway.toml, extra files."""

    def make(
        name: str = "app",
        procfile: str = WEB_PROCFILE,
        toml: str | None = None,
        files: dict[str, str] | None = None,
    ) -> Path:
        root = tmp_path / name
        root.mkdir(parents=True)
        (root / "Procfile").write_text(procfile)
        if toml is not None:
            (root / "keelway.toml").write_text(toml)
        for rel, text in (files or {}).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return root

    return make


@pytest.fixture
def git() -> Callable[..., str]:
    """Run git in a repo as a fixed test identity; returns stdout."""

    def run(repo: Path, *args: str) -> str:
        result = subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "-c",
                "user.email=test@keelway.test",
                "-c",
                "user.name=keelway test",
                "-c",
                "init.defaultBranch=main",
                "-c",
                "commit.gpgsign=false",
                *args,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return result.stdout.strip()

    return run


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> DepsCache:
    """One dependency cache for every builds test: a venv of the same key is made once."""
    return DepsCache(tmp_path_factory.mktemp("deps-cache"))
