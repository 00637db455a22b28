"""The app contract: Procfile and keelway.toml into a Manifest, and every refusal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import BuildInputError, ManifestError
from keelway.builds.manifest import Mode, ServiceKind, load_manifest

MakeApp = Callable[..., Path]


def test_procfile_with_comments_blank_lines_and_release_gives_services_and_release_command(
    make_app: MakeApp,
) -> None:
    app = make_app(
        procfile=(
            "# the web process\n"
            "\n"
            "web: gunicorn app:app --bind 127.0.0.1:$PORT\n"
            "   # indented comment\n"
            "worker:python worker.py   \n"
            "release: python manage.py migrate\r\n"
            "mail_out-2: python mail.py --url=http://x:1/\n"
        )
    )
    manifest = load_manifest(app)
    assert list(manifest.services) == ["web", "worker", "mail_out-2"]
    assert manifest.services["web"].command == "gunicorn app:app --bind 127.0.0.1:$PORT"
    assert manifest.services["worker"].command == "python worker.py"
    assert manifest.services["mail_out-2"].command == "python mail.py --url=http://x:1/"
    assert manifest.release_command == "python manage.py migrate"
    assert manifest.build_command is None


def test_defaults_differ_by_kind_web_overlaps_and_workers_hold(make_app: MakeApp) -> None:
    manifest = load_manifest(make_app(procfile="web: a\nworker: b\n"))
    web, worker = manifest.services["web"], manifest.services["worker"]
    assert (web.kind, web.mode) == (ServiceKind.WEB, Mode.OVERLAP)
    assert (worker.kind, worker.mode) == (ServiceKind.WORKER, Mode.HOLD)
    for spec in (web, worker):
        assert spec.health == "/"
        assert spec.settle_s == 10.0
        assert spec.stop_grace_s == 10.0
        assert spec.idle_s is None
    assert manifest.release_command is None


def test_duplicate_process_names_are_refused_naming_both_lines(make_app: MakeApp) -> None:
    app = make_app(procfile="web: a\n\nweb: b\n")
    with pytest.raises(ManifestError, match=r"Procfile line 3: .*'web'.* line 1"):
        load_manifest(app)


@pytest.mark.parametrize("name", ["Web", "1web", "we b", "_web", "wéb", "web.2"])
def test_bad_process_names_are_refused_with_their_line(make_app: MakeApp, name: str) -> None:
    app = make_app(procfile=f"web: ok\n{name}: run\n")
    with pytest.raises(ManifestError, match="Procfile line 2: process name"):
        load_manifest(app)


def test_a_line_without_a_colon_is_refused(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match="Procfile line 1: expected `name: command`"):
        load_manifest(make_app(procfile="python app.py\n"))


def test_a_process_without_a_command_is_refused(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match="Procfile line 2: process 'worker' has no command"):
        load_manifest(make_app(procfile="web: a\nworker:   \n"))


def test_a_procfile_without_web_says_what_line_to_add(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match=r"no `web` process.*add a line like `web: "):
        load_manifest(make_app(procfile="worker: python worker.py\n"))


def test_an_empty_procfile_is_refused_for_lacking_web(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match="no `web` process"):
        load_manifest(make_app(procfile="# nothing yet\n"))


def test_a_missing_procfile_is_an_error_that_says_to_add_one(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no Procfile.*add one"):
        load_manifest(tmp_path)


def test_a_procfile_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "Procfile").write_bytes(b"web: caf\xe9\n")
    with pytest.raises(ManifestError, match="Procfile is not UTF-8"):
        load_manifest(tmp_path)


def test_manifest_errors_are_the_users_input_errors() -> None:
    assert issubclass(ManifestError, BuildInputError)


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ('"10s"', 10.0),
        ('"500ms"', 0.5),
        ('"15m"', 900.0),
        ('"1h"', 3600.0),
        ('"1m30s"', 90.0),
        ('"2.5s"', 2.5),
        ("3", 3.0),
        ("0.25", 0.25),
        ('"0s"', 0.0),
        ('"1d"', 86400.0),
        ('"1y"', 365 * 86400.0),
    ],
)
def test_durations_are_strings_with_units_or_numbers_of_seconds(
    make_app: MakeApp, written: str, seconds: float
) -> None:
    app = make_app(toml=f"[services.web]\nsettle = {written}\nstop_grace = {written}\n")
    web = load_manifest(app).services["web"]
    assert web.settle_s == seconds
    assert web.stop_grace_s == seconds


@pytest.mark.parametrize(
    "written", ['"10"', '"ten seconds"', '"10 s"', '"1w"', '"-5s"', "-1", "true", '""', "inf"]
)
def test_anything_else_as_a_duration_is_refused_naming_the_key(
    make_app: MakeApp, written: str
) -> None:
    app = make_app(toml=f"[services.web]\nsettle = {written}\n")
    with pytest.raises(ManifestError, match=r"keelway.toml \[services.web\] settle"):
        load_manifest(app)


def test_keelway_toml_sets_every_service_setting(make_app: MakeApp) -> None:
    app = make_app(
        procfile="web: a\nworker: b\n",
        toml=(
            '[build]\ncommand = "make assets"\n\n'
            '[services.web]\nmode = "hold"\nhealth = "/healthz"\nsettle = "3s"\n'
            'stop_grace = "500ms"\nidle = "15m"\n\n'
            '[services.worker]\nmode = "overlap"\n'
        ),
    )
    manifest = load_manifest(app)
    web, worker = manifest.services["web"], manifest.services["worker"]
    assert manifest.build_command == "make assets"
    assert (web.mode, web.health, web.settle_s, web.stop_grace_s, web.idle_s) == (
        Mode.HOLD,
        "/healthz",
        3.0,
        0.5,
        900.0,
    )
    assert worker.mode is Mode.OVERLAP
    assert worker.settle_s == 10.0


def test_an_unknown_mode_is_refused_listing_the_allowed_ones(make_app: MakeApp) -> None:
    app = make_app(toml='[services.web]\nmode = "fast"\n')
    allowed = r"\[services.web\] mode: 'fast' is not one of overlap, hold"
    with pytest.raises(ManifestError, match=allowed):
        load_manifest(app)


def test_an_unknown_key_in_a_service_table_is_refused_naming_the_table(make_app: MakeApp) -> None:
    app = make_app(toml='[services.web]\nsetle = "3s"\n')
    with pytest.raises(ManifestError, match=r"\[services.web\].*unknown field `setle`"):
        load_manifest(app)


@pytest.mark.parametrize(
    ("toml", "where"),
    [
        ("port = 80\n", r"keelway.toml: .*unknown field `port`"),
        ('[build]\ncmd = "x"\n', r"keelway.toml \[build\]: .*unknown field `cmd`"),
        ("[services]\nweb = 3\n", r"keelway.toml \[services.<name>\]"),
        ("[services.web]\nhealth = 3\n", r"\[services.web\] health: Expected `str"),
    ],
)
def test_unknown_keys_and_wrong_types_are_refused(make_app: MakeApp, toml: str, where: str) -> None:
    with pytest.raises(ManifestError, match=where):
        load_manifest(make_app(toml=toml))


def test_a_service_table_for_a_process_not_in_the_procfile_is_refused(make_app: MakeApp) -> None:
    app = make_app(procfile="web: a\nworker: b\n", toml="[services.wrker]\nidle = 3\n")
    expected = r"\[services.wrker\]: .*no process 'wrker'.*web, worker"
    with pytest.raises(ManifestError, match=expected):
        load_manifest(app)


def test_a_service_table_for_release_is_refused(make_app: MakeApp) -> None:
    app = make_app(procfile="web: a\nrelease: b\n", toml='[services.release]\nsettle = "1s"\n')
    with pytest.raises(ManifestError, match="one-shot command, not a service"):
        load_manifest(app)


@pytest.mark.parametrize("health", ["healthz", "/health z", ""])
def test_a_health_path_must_start_with_a_slash_and_have_no_spaces(
    make_app: MakeApp, health: str
) -> None:
    app = make_app(toml=f'[services.web]\nhealth = "{health}"\n')
    with pytest.raises(ManifestError, match=r"\[services.web\] health"):
        load_manifest(app)


def test_idle_of_zero_is_refused_because_removing_it_means_never_park(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match="remove `idle` to never park"):
        load_manifest(make_app(toml='[services.web]\nidle = "0s"\n'))


def test_an_empty_build_command_is_refused(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match=r"\[build\]: command is empty"):
        load_manifest(make_app(toml='[build]\ncommand = "  "\n'))


def test_invalid_toml_is_refused_with_its_line(make_app: MakeApp) -> None:
    with pytest.raises(ManifestError, match=r"not valid TOML.*line 2"):
        load_manifest(make_app(toml='[services.web]\nsettle = "3s\n'))
