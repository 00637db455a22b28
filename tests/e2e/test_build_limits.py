"""A build's limits through the real CLI (issue #20): a build past its `[build] memory`
is killed out of memory and its deploy fails saying so, while the release already
running keeps serving through the router and the router and control plane carry on;
`doctor` says the build limits and which this box enforces."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

# Allocates (and touches) 8M at a time up to 192M, 3x the limit, then exits 0: the build
# fails only if something killed it, and a box without limits is hurt only briefly.
HOG = ("python3 -c \\\"b = []\\nfor _ in range(24): b.append(b'x' * (8 << 20))\\n"
       "print('allocated 192M')\\\"")


def _app(root: Path, version: str, build: str = "") -> Path:
    app = root / version
    app.mkdir(parents=True)
    (app / "index.html").write_text(f"release {version}\n")
    (app / "Procfile").write_text("web: python3 -m http.server --bind 127.0.0.1 $PORT\n")
    (app / "keelway.toml").write_text(
        f'[services.web]\nsettle = "0.2s"\nstop_grace = "2s"\n{build}')
    return app


def test_a_build_past_its_memory_fails_and_the_running_release_keeps_serving(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    checks = {c["check"]: c for c in kw.run("doctor", "--json").json()["checks"]
              if c["check"].startswith("build ")}
    assert set(checks) == {"build memory limit", "build timeout limit", "build disk limit",
                           "build priority"}
    assert checks["build timeout limit"]["ok"] and "at most 30m" in (
        checks["build timeout limit"]["detail"])
    assert checks["build disk limit"]["ok"] and "at most 4G" in (
        checks["build disk limit"]["detail"])
    assert "nice 10" in checks["build priority"]["detail"]
    if not checks["build memory limit"]["ok"]:
        assert "not enforced on this box" in checks["build memory limit"]["detail"]
        pytest.skip("this box enforces no build memory limit: "
                    f"{checks['build memory limit']['detail']}")
    assert "a cgroup per build step" in checks["build memory limit"]["detail"]

    kw.ok("deploy", "site", str(_app(tmp_path, "v1")), "--host", "site.test")
    assert kw.get("site.test", "/")[:2] == (200, b"release v1\n")

    began = time.monotonic()
    failed = kw.run("deploy", "site",
                    str(_app(tmp_path, "v2", f'[build]\ncommand = "{HOG}"\nmemory = "64M"\n')))
    took = time.monotonic() - began
    print(f"the deploy of an OOM-killed build failed in {took:.2f} s")
    assert failed.code != 0
    said = failed.out + failed.err
    assert "build killed: out of memory at its 64M limit" in said, said
    assert "| allocated 192M" not in said  # killed on its way, never done
    assert "raise [build] memory" in said

    # The running release is untouched, served through the router; nothing else moved.
    assert kw.get("site.test", "/")[:2] == (200, b"release v1\n")
    releases = kw.ok("releases", "site", "--json").json()["releases"]
    assert [r["version"] for r in releases] == ["v1"]
    status = kw.ok("status", "--json").json()
    assert status["router"]["state"] == "serving"
    # The control plane is alive (it answered), and so is the pid that `up` started.
    assert kw.daemon_pid is not None and Path(f"/proc/{kw.daemon_pid}").is_dir()


def test_up_refuses_a_build_limit_it_cannot_take_before_anything_starts(kw: Keelway) -> None:
    refused = kw.run("up", "-d", "--build-timeout", "soon")
    assert refused.code != 0
    assert "--build-timeout: 'soon' is not a duration" in refused.err
    assert not (kw.home / "keelway.lock").exists() or kw.run("status").code != 0


def test_an_app_asking_for_more_than_the_box_allows_is_refused_saying_the_ceiling(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up("--build-memory", "512M", "--build-timeout", "5m")
    checks = {c["check"]: c for c in kw.run("doctor", "--json").json()["checks"]}
    assert "at most 512M" in checks["build memory limit"]["detail"]
    assert "at most 5m" in checks["build timeout limit"]["detail"]
    failed = kw.run("deploy", "greedy", str(_app(tmp_path, "v1", '[build]\nmemory = "1G"\n')),
                    "--host", "greedy.test")
    assert failed.code != 0
    assert "memory 1G is above this box's 512M" in failed.out + failed.err


def test_a_build_run_as_its_app_s_builder_uid_is_confined_and_killed_alike(
        kw_root: Keelway, tmp_path: Path) -> None:
    # As root, each app builds as a uid of its own: the step drops to it before its
    # first instruction, so it is the control plane that moves it into its cgroup, at
    # the step's gate (keelway/builds/build_step.py).
    kw_root.up()
    doctor = {c["check"]: c for c in kw_root.run("doctor", "--json").json()["checks"]}
    if not doctor["uid per instance"]["ok"] or not doctor["build memory limit"]["ok"]:
        pytest.skip("needs a uid per instance and a memory controller: "
                    f"{doctor['uid per instance']['detail']}; "
                    f"{doctor['build memory limit']['detail']}")
    probe = _app(tmp_path, "probe", '[build]\ncommand = "id -u > builder-uid; '
                                    'cut -d\' \' -f19 /proc/self/stat > nice"\n')
    kw_root.ok("deploy", "probe", str(probe), "--host", "probe.test")
    build = next((kw_root.home / "builds" / "probe").iterdir())
    assert int((build / "builder-uid").read_text()) != 0
    assert int((build / "nice").read_text()) >= 10
    failed = kw_root.run("deploy", "probe", str(
        _app(tmp_path, "hog", f'[build]\ncommand = "{HOG}"\nmemory = "64M"\n')))
    assert failed.code != 0
    assert "build killed: out of memory at its 64M limit" in failed.out + failed.err
    assert kw_root.get("probe.test", "/")[0] == 200
