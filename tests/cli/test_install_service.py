"""`keelway install-service`, run in-process into a temp --unit-dir: the unit's fields
parsed back as systemd reads them (and checked by `systemd-analyze verify` where the
box has it); --print writes nothing; a different unit is kept without --force; bad
flags for `up` are refused with nothing written."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from keelway.cli.main import cli
from keelway.cli.service import unit_text

ME = pwd.getpwuid(os.geteuid()).pw_name


def _install(*args: str) -> Result:
    return CliRunner().invoke(cli, ["install-service", *args], prog_name="keelway")


def _fields(text: str) -> dict[str, dict[str, str]]:
    """Each section's directives (the last of a repeated one), comments skipped."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current[key] = value
    return sections


def test_the_unit_runs_this_keelways_up_in_the_foreground_and_survives_restarts(
        tmp_path: Path) -> None:
    home = tmp_path / "kh"
    done = _install("--user", ME, "--home", str(home), "--unit-dir", str(tmp_path), "--",
                    "--http", "127.0.0.1:8080", "--https", "127.0.0.1:8443")
    assert done.exit_code == 0, done.output
    assert "systemctl daemon-reload && systemctl enable --now keelway" in done.output
    unit = _fields((tmp_path / "keelway.service").read_text())
    service = unit["Service"]
    assert shlex.split(service["ExecStart"]) == [
        sys.executable, "-m", "keelway.cli.main", "up", "--http", "127.0.0.1:8080",
        "--https", "127.0.0.1:8443"]
    assert shlex.split(service["ExecStop"].removeprefix("-")) == [
        sys.executable, "-m", "keelway.cli.main", "down", "--keep-apps"]
    assert service["User"] == ME
    assert service["Environment"] == f"KEELWAY_HOME={home}"
    assert service["Restart"] == "always" and service["KillMode"] == "process"
    assert service["Delegate"] == "yes" and int(service["LimitNOFILE"]) >= 65536
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert (tmp_path / "keelway.service").stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_reads_the_unit_without_a_complaint(tmp_path: Path) -> None:
    assert _install("--user", ME, "--home", str(tmp_path / "a home"), "--unit-dir",
                    str(tmp_path), "--", "--http", "127.0.0.1:8080").exit_code == 0
    checked = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "keelway.service")],
                             capture_output=True, text=True, timeout=60)
    # It says nothing of a unit it reads whole; an unknown or bad line it names.
    complaints = [line for line in (checked.stdout + checked.stderr).splitlines()
                  if "keelway.service" in line]
    assert checked.returncode == 0 and complaints == [], checked.stdout + checked.stderr


def test_print_writes_nothing_and_shows_the_unit(tmp_path: Path) -> None:
    done = _install("--user", ME, "--home", str(tmp_path), "--unit-dir", str(tmp_path),
                    "--print")
    assert done.exit_code == 0 and "[Service]" in done.output and "Restart=always" in done.output
    assert list(tmp_path.iterdir()) == []
    as_json = _install("--json", "--user", ME, "--home", str(tmp_path), "--unit-dir",
                       str(tmp_path), "--print")
    assert '"written": false' in as_json.output and list(tmp_path.iterdir()) == []


def test_a_different_unit_is_kept_unless_forced_and_the_same_one_is_left_alone(
        tmp_path: Path) -> None:
    path = tmp_path / "keelway.service"
    path.write_text("[Service]\nExecStart=/bin/true\n")
    args = ["--user", ME, "--home", str(tmp_path / "kh"), "--unit-dir", str(tmp_path)]
    refused = _install(*args)
    assert refused.exit_code == 1 and "--force" in refused.output
    assert path.read_text() == "[Service]\nExecStart=/bin/true\n"
    assert _install(*args, "--force").exit_code == 0
    assert "Restart=always" in path.read_text()
    again = _install(*args)
    assert again.exit_code == 0 and "unchanged" in again.output


@pytest.mark.parametrize(("up_args", "said"), [
    (["--no-such-flag"], "No such option"),
    (["-d"], "foreground"),
    (["--router-workers", "0"], "router-workers"),
])
def test_flags_up_would_refuse_are_refused_and_nothing_is_written(
        tmp_path: Path, up_args: list[str], said: str) -> None:
    done = _install("--user", ME, "--home", str(tmp_path), "--unit-dir", str(tmp_path),
                    "--", *up_args)
    assert done.exit_code == 1 and said in done.output, done.output
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_user_is_refused(tmp_path: Path) -> None:
    done = _install("--user", "no-such-user-here", "--home", str(tmp_path),
                    "--unit-dir", str(tmp_path))
    assert done.exit_code == 1 and "no user" in done.output
    assert list(tmp_path.iterdir()) == []


def test_values_with_spaces_percent_and_dollar_reach_the_process_as_written() -> None:
    text = unit_text("/opt/my env/bin/python", "root", Path("/srv/kw 100%"),
                     ["--acme-email", "a$b@example.com"])
    unit = _fields(text)["Service"]
    assert unit["Environment"] == '"KEELWAY_HOME=/srv/kw 100%%"'
    assert unit["ExecStart"].startswith('"/opt/my env/bin/python" -m keelway.cli.main up')
    assert unit["ExecStart"].endswith("--acme-email a$$b@example.com")
