"""Detection of an app's dependencies with no [build] command: which installer, which
interpreter, which node; every refusal before any install, saying what the box has."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds import toolchain
from keelway.builds.cache import DepsCache
from keelway.builds.errors import BuildInputError
from keelway.builds.manifest import load_manifest
from keelway.builds.stage import stage

MakeApp = Callable[..., Path]

UV_PROJECT = ('[project]\nname = "uvapp"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
              "dependencies = []\n")
UV_LOCK = ('version = 1\nrevision = 5\nrequires-python = ">=3.11"\n\n[[package]]\n'
           'name = "uvapp"\nversion = "0.1.0"\nsource = { virtual = "." }\n')


def _venv_version(build: Path) -> str:
    cfg = (build / ".venv" / "pyvenv.cfg").read_text()
    return next(line.split("=")[1].strip() for line in cfg.splitlines()
                if line.startswith(("version =", "version_info =")))


@pytest.mark.slow
def test_a_python_version_the_box_lacks_is_refused_naming_the_versions_it_has(
        make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(files={"requirements.txt": "# nothing\n", ".python-version": "3.99\n"})
    with pytest.raises(BuildInputError) as caught:
        stage(app, builds_dir=builds_dir, app="demo")
    message = str(caught.value)
    assert "asks for Python 3.99, which this box does not have" in message
    assert "3.11" in message.partition("it has: ")[2]
    assert [p.name for p in (builds_dir / "demo").iterdir()] == []


@pytest.mark.slow
def test_runtime_txt_picks_the_interpreter_of_the_venv(
        make_app: MakeApp, builds_dir: Path, shared_cache: DepsCache) -> None:
    app = make_app(files={"requirements.txt": "# nothing\n", "runtime.txt": "python-3.11\n"})
    build = stage(app, builds_dir=builds_dir, app="demo", cache=shared_cache).path
    assert _venv_version(build).startswith("3.11.")


@pytest.mark.slow
def test_python_version_names_another_python_the_box_has(
        make_app: MakeApp, builds_dir: Path) -> None:
    others = sorted({py.version[:2] for py in toolchain.box_pythons()} - {(3, 11)})
    if not others:
        pytest.skip("this box has no Python but 3.11")
    major, minor = others[-1]
    app = make_app(files={"requirements.txt": "# nothing\n",
                          ".python-version": f"{major}.{minor}\n"})
    build = stage(app, builds_dir=builds_dir, app="demo").path
    assert _venv_version(build).startswith(f"{major}.{minor}.")


def test_an_unreadable_python_version_file_is_refused(make_app: MakeApp,
                                                        builds_dir: Path) -> None:
    app = make_app(files={"requirements.txt": "\n", ".python-version": "latest please\n"})
    with pytest.raises(BuildInputError, match="is not a Python version"):
        stage(app, builds_dir=builds_dir, app="demo")


@pytest.mark.slow
def test_a_pyproject_without_requirements_gets_a_venv_of_its_dependencies(
        make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(files={"pyproject.toml": UV_PROJECT})
    seen: list[str] = []
    build = stage(app, builds_dir=builds_dir, app="demo", progress=seen.append).path
    assert (build / ".venv" / "bin" / "python").exists()
    assert "pyproject.toml lists no dependencies to install" in seen


def test_a_uv_lock_is_synced_with_uv_into_the_builds_venv(
        make_app: MakeApp, builds_dir: Path) -> None:
    app = make_app(files={"pyproject.toml": UV_PROJECT, "uv.lock": UV_LOCK})
    seen: list[str] = []
    build = stage(app, builds_dir=builds_dir, app="demo", progress=seen.append).path
    assert "installing uv.lock's dependencies with uv" in seen
    assert (build / ".venv" / "bin" / "python").exists()
    assert "uv sync --frozen" in (build / ".keelway-build.log").read_text()


def test_an_engines_node_the_box_lacks_is_refused_before_any_install(
        make_app: MakeApp, builds_dir: Path) -> None:
    if toolchain.node_version() is None:
        pytest.skip("no node on this box")
    package = {"name": "x", "version": "1.0.0", "engines": {"node": ">=99"},
               "dependencies": {"left-pad": "1.3.0"}}
    app = make_app(files={"package.json": json.dumps(package)})
    with pytest.raises(BuildInputError, match=r"engines.node asks for '>=99'.*this box has"):
        stage(app, builds_dir=builds_dir, app="demo")
    assert [p.name for p in (builds_dir / "demo").iterdir()] == []


def test_a_package_json_with_a_start_script_and_no_procfile_runs_npm_start_as_web(
        tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"scripts": {"start": "node server.js"}}))
    manifest = load_manifest(app)
    assert manifest.services["web"].command == "npm start"
    (app / "Procfile").write_text("web: node other.js\n")
    assert load_manifest(app).services["web"].command == "node other.js"


def test_npm_ci_installs_from_a_lockfile_with_no_build_command(
        make_app: MakeApp, builds_dir: Path) -> None:
    if toolchain.node_version() is None or shutil.which("npm") is None:
        pytest.skip("no node on this box")
    package = {"name": "x", "version": "1.0.0", "scripts": {"build": "echo built > out.txt"}}
    lock = {"name": "x", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": "x", "version": "1.0.0"}}}
    app = make_app(files={"package.json": json.dumps(package),
                          "package-lock.json": json.dumps(lock)})
    seen: list[str] = []
    build = stage(app, builds_dir=builds_dir, app="demo", progress=seen.append).path
    assert "installing node modules: npm ci" in seen
    assert (build / "out.txt").read_text() == "built\n"  # its build script ran


@pytest.mark.parametrize(("spec", "expected"), [
    (">=18", True), ("^20", True), ("20.x", True), (">=18 <21", True), ("^18 || ^20", True),
    ("18 - 20", True), ("<=20", True), ("*", True), ("~20.1", False), ("<20", False),
    (">20", False), ("22", False), ("^0.20", False), (">=18.0.0-rc.1", None),
])
def test_engines_node_ranges_are_read_as_npm_reads_them(spec: str,
                                                        expected: bool | None) -> None:
    assert toolchain.satisfies((20, 20, 2), spec) is expected
