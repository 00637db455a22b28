"""The router's hot path loads all compiled or all from source, never a mix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import keelway.router as router
from keelway.router import HOT_PATH, _compiled_is_current

SUFFIX = router._SUFFIX
REPO = Path(__file__).resolve().parents[2]


def _built(directory: Path, mtime: float) -> None:
    for name in (*HOT_PATH, "native__mypyc"):
        for path in (directory / f"{name}{SUFFIX}", directory / f"{name}.py"):
            if name == "native__mypyc" and path.suffix == ".py":
                continue
            path.write_text("")
            os.utime(path, (mtime, mtime))


def test_a_build_is_current_until_a_source_is_edited_after_it(tmp_path: Path) -> None:
    _built(tmp_path, 1_000_000.0)
    assert _compiled_is_current(tmp_path)
    os.utime(tmp_path / "exchange.py", (1_000_001.0, 1_000_001.0))  # same install
    assert _compiled_is_current(tmp_path)
    os.utime(tmp_path / "exchange.py", (1_000_060.0, 1_000_060.0))  # edited later
    assert not _compiled_is_current(tmp_path)


def test_a_partial_build_is_not_used(tmp_path: Path) -> None:
    _built(tmp_path, 1_000_000.0)
    (tmp_path / f"upstream{SUFFIX}").unlink()
    assert not _compiled_is_current(tmp_path)
    _built(tmp_path, 1_000_000.0)
    (tmp_path / f"native__mypyc{SUFFIX}").unlink()
    assert not _compiled_is_current(tmp_path)


def _loaded_from(env: dict[str, str]) -> list[str]:
    code = (
        "import keelway.router as r, importlib\n"
        "for m in r.HOT_PATH:\n"
        "    print(importlib.import_module('keelway.router.' + m).__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_pure_python_on_request_loads_every_hot_module_from_source() -> None:
    files = _loaded_from({**os.environ, "KEELWAY_PURE_PYTHON": "1"})
    assert len(files) == len(HOT_PATH)
    assert all(f.endswith(".py") for f in files), files


def test_otherwise_the_hot_modules_load_all_one_way() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KEELWAY_PURE_PYTHON"}
    files = _loaded_from(env)
    compiled = [f.endswith(SUFFIX) for f in files]
    assert all(compiled) or not any(compiled), files
    assert all(compiled) == _compiled_is_current(REPO / "keelway" / "router")
