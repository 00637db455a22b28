"""The CLI's papercuts, each as a user meets it: `--json` wherever it is typed, an
example at the end of every command's help, the limit said with a too-long name, an
`unset` of nothing that makes no release, and `status` that never cuts a hostname."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from keelway.cli.examples import EXAMPLES, commands
from keelway.cli.main import cli
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway
from tests.test_docs import problems


def test_every_command_ends_its_help_with_an_example_of_itself() -> None:
    missing = []
    for path, command in commands(cli):
        example = EXAMPLES.get(path)
        if example is None or not _names(example, path):
            missing.append(path or "keelway")
            continue
        ctx = click.Context(command, info_name=f"keelway {path}".strip())
        assert f"Example: {example}" in command.get_help(ctx)
    assert missing == []
    assert set(EXAMPLES) == {path for path, _ in commands(cli)}  # none for a gone command


def _names(example: str, path: str) -> bool:
    """Whether `example` runs the command `path` (a group's arguments may come between
    its words: `keelway config blog set K=V`)."""
    words = iter(example.split()[1:])
    return example.startswith("keelway") and all(w in words for w in path.split())


def test_every_example_names_only_flags_its_command_has() -> None:
    doc = "```sh\n" + "\n".join(EXAMPLES.values()) + "\n```\n"
    assert problems(doc) == []


def test_every_command_and_group_takes_json() -> None:
    lacking = [path for path, command in commands(cli)
               if not any("--json" in p.opts for p in command.params
                          if isinstance(p, click.Option))]
    assert lacking == []


@pytest.mark.parametrize("argv", [
    ["--json", "status"], ["status", "--json"], ["status", "blog", "--json"],
    ["db", "--json", "snapshots", "a.test"], ["--json", "db", "snapshots", "a.test"],
    ["db", "snapshots", "--json", "a.test"], ["config", "--json", "blog"],
    ["config", "blog", "--json", "set", "K=V"], ["--json", "config", "blog", "unset", "K"],
    ["apps", "--json", "create", "shop"], ["--json", "doctor"],
])
def test_json_anywhere_on_the_line_answers_in_json(argv: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # No control plane runs for this home: the answer is the not-running error, in JSON.
    monkeypatch.setenv("KEELWAY_HOME", str(tmp_path / "kh"))
    done = CliRunner().invoke(cli, argv, prog_name="keelway")
    assert done.exit_code == 1
    answer = json.loads(done.stdout)
    assert answer.get("error", {}).get("code") == "not-running" or "checks" in answer, answer


def test_without_json_the_answer_is_words(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEELWAY_HOME", str(tmp_path / "kh"))
    done = CliRunner().invoke(cli, ["db", "snapshots", "a.test"], prog_name="keelway")
    assert done.exit_code == 1 and "keelway is not running" in done.output


@pytest.mark.slow
def test_a_user_meets_no_papercut(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    host = "a-rather-long-tenant-name-that-needs-room.customers.example-company.test"
    kw.ok("deploy", "blog", str(hello(tmp_path, "v1")), "--host", host)

    # A too-long name says the limit it is past, and nothing is made.
    long_app = kw.run("apps", "create", "a" * 64)
    assert long_app.code == 1 and "the limit for app names is 63" in long_app.err
    label = kw.run("instances", "add", "blog", "x" * 64 + ".test")
    assert label.code == 1 and "64 characters, and the limit is 63" in label.err
    assert [a["name"] for a in kw.ok("apps", "--json").json()["apps"]] == ["blog"]

    # An unset of a name that is not set changes nothing and makes no release.
    releases = kw.ok("releases", "blog", "--json").json()["releases"]
    nothing = kw.ok("config", "blog", "unset", "NEVER_SET")
    assert "not set" in nothing.out and "no release" in nothing.out
    assert kw.ok("releases", "blog", "--json").json()["releases"] == releases
    assert kw.ok("config", "blog", "--instance", host, "unset", "NEVER_SET").code == 0
    assert kw.ok("releases", "blog", "--json").json()["releases"] == releases
    kw.ok("config", "blog", "set", "SOME=1")
    kw.ok("config", "blog", "unset", "SOME", "NEVER_SET")  # one is set: a release
    assert len(kw.ok("releases", "blog", "--json").json()["releases"]) == len(releases) + 2

    # --json before and after the command give one answer.
    before = kw.ok("--json", "instances", "list", "blog").json()
    after = kw.ok("instances", "list", "blog", "--json").json()
    assert before == after and before["instances"][0]["host"] == host


@pytest.mark.slow
def test_status_in_a_narrow_terminal_shows_the_whole_hostname(kw: Keelway,
                                                              tmp_path: Path) -> None:
    kw.up()
    host = "a-rather-long-tenant-name-that-needs-room.customers.example-company.test"
    kw.ok("deploy", "blog", str(hello(tmp_path, "v1")), "--host", host)
    narrow = subprocess.run([sys.executable, "-m", "keelway.cli.main", "status"],
                            env={**kw.env(), "COLUMNS": "40"}, capture_output=True,
                            text=True, timeout=60, check=True)
    assert host in narrow.stdout, narrow.stdout
