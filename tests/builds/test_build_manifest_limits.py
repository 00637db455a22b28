"""`memory`, `cpu`, `pids` and `nofile` of a service in keelway.toml (keelway/limits.py):
read as people write them, unset ones left to the box, bad ones refused naming where."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import load_manifest
from keelway.limits import Limits


def _app(tmp_path: Path, toml: str | None) -> Path:
    (tmp_path / "Procfile").write_text("web: python3 -m http.server $PORT\nworker: sleep 1\n")
    if toml is not None:
        (tmp_path / "keelway.toml").write_text(toml)
    return tmp_path


def test_a_service_s_limits_are_its_own_and_the_rest_the_box_s(tmp_path: Path) -> None:
    manifest = load_manifest(_app(tmp_path, '[services.web]\nmemory = "512M"\ncpu = "0.5"\n'
                                            "pids = 128\nnofile = 2048\n"))
    assert manifest.services["web"].limits == Limits(512 << 20, 0.5, 128, 2048)
    assert manifest.services["worker"].limits == Limits()
    bare = tmp_path / "bare"
    bare.mkdir()
    assert load_manifest(_app(bare, None)).services["web"].limits == Limits()


@pytest.mark.parametrize(("line", "said"), [
    ('memory = "lots"', r"\[services.web\] memory: 'lots' is not an amount of memory"),
    ('memory = "4M"', "below the 16M"),
    ('cpu = "half"', r"\[services.web\] cpu: 'half' is not a number of CPUs"),
    ("pids = 2", r"\[services.web\] pids: 2 is out of range"),
    ("nofile = 10", "nofile: 10 is out of range"),
    ('pids = "many"', "pids"),
])
def test_a_limit_that_cannot_be_taken_is_refused_naming_where(
        tmp_path: Path, line: str, said: str) -> None:
    with pytest.raises(ManifestError, match=said):
        load_manifest(_app(tmp_path, f"[services.web]\n{line}\n"))


def test_http_max_concurrency_is_read_and_checked(tmp_path: Path) -> None:
    assert load_manifest(_app(tmp_path, "[http]\nmax_concurrency = 20\n")
                         ).http_max_concurrency == 20
    for bad, said in (("0", "out of range"), ('"many"', "max_concurrency"),
                      ("1000000", "out of range")):
        with pytest.raises(ManifestError, match=said):
            load_manifest(_app(tmp_path, f"[http]\nmax_concurrency = {bad}\n"))


def test_http_force_https_and_hsts_are_read_and_checked(tmp_path: Path) -> None:
    manifest = load_manifest(_app(tmp_path, '[http]\nforce_https = true\nhsts = "1y"\n'))
    assert manifest.http_force_https and manifest.http_hsts_s == 365 * 86400
    plain = load_manifest(_app(tmp_path, "[http]\nmax_concurrency = 5\n"))
    assert not plain.http_force_https and plain.http_hsts_s is None
    for bad, said in (('force_https = "yes"', "force_https"), ('hsts = "soon"', "hsts"),
                      ("hsts = 0", "at least a second")):
        with pytest.raises(ManifestError, match=said):
            load_manifest(_app(tmp_path, f"[http]\n{bad}\n"))
