"""`ready_timeout` per service in keelway.toml (SPEC §3): how long a web has to answer
its health path, 60 s unless it says otherwise; and Procfile lines kept as written, for
the shell that runs them (keelway/runtime/shell.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import DEFAULT_READY_TIMEOUT_S, load_manifest

MakeApp = Callable[..., Path]


def test_ready_timeout_defaults_to_a_minute_and_takes_a_duration_per_service(
    make_app: MakeApp,
) -> None:
    manifest = load_manifest(make_app(
        procfile="web: a\nworker: b\n",
        toml='[services.web]\nready_timeout = "1m30s"\n\n[services.worker]\nsettle = "1s"\n'))
    assert manifest.services["web"].ready_timeout_s == 90.0
    assert manifest.services["worker"].ready_timeout_s == DEFAULT_READY_TIMEOUT_S == 60.0
    plain = load_manifest(make_app(name="plain", procfile="web: a\n"))
    assert plain.services["web"].ready_timeout_s == 60.0


@pytest.mark.parametrize(("value", "said"), [
    ('"0s"', "ready_timeout: must be longer than zero"),
    ('"soon"', "ready_timeout: 'soon' is not a duration"),
    ("-1", "ready_timeout: -1.0 must be a finite, non-negative duration"),
])
def test_a_ready_timeout_that_is_no_positive_duration_is_refused_naming_it(
    make_app: MakeApp, value: str, said: str
) -> None:
    app = make_app(toml=f"[services.web]\nready_timeout = {value}\n")
    with pytest.raises(ManifestError, match=r"^keelway\.toml") as raised:
        load_manifest(app)
    assert f"[services.web] {said}" in str(raised.value)


def test_a_procfile_line_that_starts_with_assignments_is_kept_as_written(
    make_app: MakeApp,
) -> None:
    manifest = load_manifest(make_app(
        procfile='web: ISSO_SETTINGS=isso.cfg GREETING="a: b" isso run\n'))
    assert manifest.services["web"].command == 'ISSO_SETTINGS=isso.cfg GREETING="a: b" isso run'
