"""Benchmark: the first deploy and a code-only redeploy of the Django fixture, without
and with the dependency cache.

    .venv/bin/python bench/build.py [--rounds 1]

SPEC §7 figure: a code-only redeploy of a Django-size app with its dependencies cached
takes <= 5 s plus boot and settle. For each mode (cache off: `KEELWAY_BUILD_CACHE=off`;
cache on: a fresh, empty cache directory) a fresh KEELWAY_HOME gets the first deploy of
tests/e2e/apps/django_site (Django + gunicorn from PyPI, `release` runs migrate, settle
1 s), then one change to a view and the redeploy. Each deploy's wall time is split at
the progress line that says the build is staged: the build part (what the cache
shortens) and the rest (release command, boot, ready, settle 1 s). pip's own download
cache (~/.cache/pip) is left as it is in both modes, so "off" is a warm-pip rebuild, not
a cold one.

Requests go only to 127.0.0.1; everything started here is stopped here (`keelway down`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy_under_load import free_port  # noqa: E402

APP = ROOT / "tests" / "e2e" / "apps" / "django_site"
HOST = "site.test"
TARGET_S = 5.0


def cli(env: dict[str, str], *args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "keelway.cli.main", *args], env=env,
                         capture_output=True, text=True, timeout=600,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"keelway {' '.join(args)}: {out.stdout}{out.stderr}")


def deploy(env: dict[str, str], source: Path) -> tuple[float, float]:
    """One deploy through the CLI: (seconds until the build was staged, total seconds)."""
    start = time.perf_counter()
    staged_at = None
    proc = subprocess.Popen([sys.executable, "-m", "keelway.cli.main", "deploy", "site",
                             str(source), "--host", HOST], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stderr is not None
    for line in proc.stderr:
        if staged_at is None and line.startswith("-> build ") and (
                line.rstrip().endswith(" staged") or line.rstrip().endswith(" reused")):
            staged_at = time.perf_counter() - start
    proc.wait(timeout=600)
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"deploy failed ({proc.returncode})")
    return staged_at or total, total


def run(mode: str, base: Path) -> dict[str, tuple[float, float]]:
    home = base / f"home-{mode}"
    source = base / f"site-{mode}"
    shutil.copytree(APP, source, ignore=shutil.ignore_patterns("__pycache__"))
    cache = "off" if mode == "off" else str(base / "cache")
    port = free_port()
    env = {**os.environ, "KEELWAY_HOME": str(home), "KEELWAY_BUILD_CACHE": cache,
           "KEELWAY_REPLICATE": "0"}
    cli(env, "up", "-d", "--http", f"127.0.0.1:{port}")
    try:
        first = deploy(env, source)
        views = source / "notes" / "views.py"
        views.write_text(views.read_text().replace('"notes"', '"memos"'))
        second = deploy(env, source)
    finally:
        cli(env, "down")
    return {"first": first, "redeploy": second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, dict[str, list[tuple[float, float]]]] = {
        "off": {"first": [], "redeploy": []}, "on": {"first": [], "redeploy": []}}
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            base = Path(tempfile.mkdtemp(prefix="kw-bench-build-"))
            try:
                for kind, figures in run(mode, base).items():
                    results[mode][kind].append(figures)
            finally:
                shutil.rmtree(base, ignore_errors=True)

    def median(mode: str, kind: str, part: int) -> float:
        return statistics.median(f[part] for f in results[mode][kind])

    print("| deploy | cache | build s | rest s (release, boot, settle 1 s) | total s |")
    print("|---|---|---|---|---|")
    for kind in ("first", "redeploy"):
        for mode in ("off", "on"):
            build, total = median(mode, kind, 0), median(mode, kind, 1)
            print(f"| {kind} | {mode} | {build:.1f} | {total - build:.1f} | {total:.1f} |")
    for kind in ("first", "redeploy"):
        ratio = median("off", kind, 1) / median("on", kind, 1)
        build_ratio = median("off", kind, 0) / median("on", kind, 0)
        print(f"{kind}: cache off / on = {ratio:.2f}x total, {build_ratio:.2f}x build")
    redeploy_build = median("on", "redeploy", 0)
    verdict = "meets" if redeploy_build <= TARGET_S else "misses"
    print(f"code-only redeploy with the cache: build {redeploy_build:.1f} s, "
          f"{verdict} the <= {TARGET_S:g} s + boot + settle target")


if __name__ == "__main__":
    main()
