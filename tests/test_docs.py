"""The docs, checked against the code they describe: every `keelway` command and every
flag that README.md and docs/*.md name is one the real CLI's `--help` shows, the README
stays a front page, and the layering table is the one tests/test_layering.py enforces.

Fast and daemon-less: the CLI's help comes from click's command tree in-process.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import click
from click.testing import CliRunner

from keelway.cli.main import cli
from tests.test_layering import ALLOWED

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

# A flag as it is written in prose or a usage line: `--purge-data`, `-n`, `--at=TIME`
# (one letter after a single dash: `-wal` and `-shm` are SQLite's side files).
_FLAG = re.compile(r"^(--[A-Za-z][\w-]*|-[A-Za-z](?![\w-]))")
# Spans that start with another tool's flag, named as that tool writes them.
OTHER_TOOLS = {"-e ."}  # a requirements.txt line: an editable install of the app itself
_SPAN = re.compile(r"`([^`]+)`")


def _invocations(text: str) -> list[str]:
    """What a doc names: each line of a code block and each inline code span, as written
    (a span may wrap across lines of its paragraph)."""
    found: list[str] = []
    prose: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            found.append(line.split(" # ")[0].strip())
        else:
            prose.append(line)
    for paragraph in "\n".join(prose).split("\n\n"):
        found.extend(" ".join(span.split()) for span in _SPAN.findall(paragraph))
    return found


def _words(invocation: str) -> list[str]:
    """The words of a usage line, its optional parts' brackets and ellipses dropped."""
    try:
        words = shlex.split(invocation, comments=False)
    except ValueError:  # an unbalanced quote in prose: the plain split is as good
        words = invocation.split()
    return [w for word in words if (w := word.strip("[]").removesuffix("...").strip("[]"))]


@cache
def _help(path: tuple[str, ...]) -> str:
    """The command's own --help; a group that takes arguments before its subcommand
    (`config APP set`) is given a placeholder for each, as a user would type them."""
    argv: list[str] = []
    command: click.Command = cli
    for word in path:
        argv += ["APP" for p in command.params if isinstance(p, click.Argument)]
        command = command.commands[word]  # type: ignore[attr-defined]
        argv.append(word)
    result = CliRunner().invoke(cli, [*argv, "--help"], prog_name="keelway")
    assert result.exit_code == 0, (path, result.output)
    return result.output


def _shows_flag(help_text: str, flag: str) -> bool:
    """Whether the help's Options section lists `flag` (prose mentioning it is not enough)."""
    options = help_text.partition("\nOptions:\n")[2]
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", options) is not None


@cache
def _real_help(path: tuple[str, ...]) -> str:
    """The command's --help from the real CLI in a process of its own: the judge when the
    in-process help lacks a flag (a suite that ran other tests in this process once
    printed every help without `-h`; an installed keelway is what a user reads)."""
    argv: list[str] = []
    command: click.Command = cli
    for word in path:
        argv += ["APP" for p in command.params if isinstance(p, click.Argument)]
        command = command.commands[word]  # type: ignore[attr-defined]
        argv.append(word)
    done = subprocess.run([sys.executable, "-m", "keelway.cli.main", *argv, "--help"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, (path, done.stdout, done.stderr)
    return done.stdout


def _has_flag(path: tuple[str, ...], flag: str) -> bool:
    return _shows_flag(_help(path), flag) or _shows_flag(_real_help(path), flag)


def _every_command() -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        paths.append(path)
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))

    walk(cli, ())
    return paths


def problems(text: str) -> list[str]:
    """What in `text` names a command or flag the CLI does not have."""
    wrong: list[str] = []
    for invocation in _invocations(text):
        words = _words(invocation)
        if not words or invocation in OTHER_TOOLS:
            continue
        if words[0] == "keelway" and len(words) > 1:
            wrong.extend(_check_command(invocation, words[1:]))
        elif _FLAG.match(words[0]):
            # A flag named on its own in prose: some command must have it.
            flag = _FLAG.match(words[0]).group(1)  # type: ignore[union-attr]
            if not any(_has_flag(path, flag) for path in _every_command()):
                wrong.append(f"`{invocation}`: no command has {flag}")
    return wrong


def _check_command(invocation: str, words: list[str]) -> list[str]:
    """Each flag is checked as click reads it: against the command or group whose name
    came last before it (`keelway config APP --instance H set K=V`: config's)."""
    command: click.Command = cli
    path: tuple[str, ...] = ()
    flags: list[tuple[tuple[str, ...], str]] = []
    for word in words:
        if word == "--":  # what follows is the command `keelway run` runs
            break
        if flag := _FLAG.match(word):
            flags.append((path, flag.group(1)))
        elif isinstance(command, click.Group) and word in command.commands:
            command, path = command.commands[word], (*path, word)
        elif not path:
            return [f"`{invocation}`: keelway has no command {word!r}"]
    return [f"`{invocation}`: keelway {' '.join(where)} has no {flag}".replace("  ", " ")
            for where, flag in flags if not _has_flag(where, flag)]


def test_every_command_and_flag_the_docs_name_is_in_the_clis_help() -> None:
    wrong = [f"{doc.relative_to(ROOT)}: {problem}"
             for doc in DOCS for problem in problems(doc.read_text())]
    assert wrong == []


def _named(text: str) -> dict[tuple[str, ...], set[str]]:
    """The commands `text` names with `keelway ...`, each with the flags named with it."""
    named: dict[tuple[str, ...], set[str]] = {}
    for invocation in _invocations(text):
        words = _words(invocation)
        if words[:1] != ["keelway"]:
            continue
        command: click.Command = cli
        path: tuple[str, ...] = ()
        flags = set()
        for word in words[1:]:
            if word == "--":
                break
            if flag := _FLAG.match(word):
                flags.add(flag.group(1))
            elif isinstance(command, click.Group) and word in command.commands:
                command, path = command.commands[word], (*path, word)
        named.setdefault(path, set()).update(flags)
    return named


def test_the_cli_reference_names_every_command_and_every_flag() -> None:
    named = _named((ROOT / "docs" / "cli.md").read_text())
    missing = []
    for path in _every_command()[1:]:
        command = cli
        for word in path:
            command = command.commands[word]  # type: ignore[attr-defined]
        if isinstance(command, click.Group) and any(
                other[:len(path)] == path for other in named):
            named.setdefault(path, set()).update(
                *(flags for other, flags in named.items() if other[:len(path)] == path))
        if path not in named:
            missing.append(f"keelway {' '.join(path)}")
            continue
        for option in command.params:
            spellings = set(option.opts) | set(option.secondary_opts)
            if isinstance(option, click.Option) and "--json" not in spellings and not (
                    spellings & named[path]):
                missing.append(f"keelway {' '.join(path)} {'/'.join(sorted(spellings))}")
    assert missing == []


def test_the_check_refuses_a_made_up_flag_and_a_made_up_command() -> None:
    doc = ("```sh\nkeelway deploy blog ./app --host a.localhost --made-up\n```\n"
           "Then `keelway db snapshot H --at-once`, `keelway teleport blog`, and\n"
           "`--no-such-flag` on its own.\n")
    assert problems(doc) == [
        "`keelway deploy blog ./app --host a.localhost --made-up`: "
        "keelway deploy has no --made-up",
        "`keelway db snapshot H --at-once`: keelway db snapshot has no --at-once",
        "`keelway teleport blog`: keelway has no command 'teleport'",
        "`--no-such-flag`: no command has --no-such-flag",
    ]


def test_the_check_reads_usage_lines_as_a_person_would() -> None:
    doc = ("```sh\nkeelway ops blog [-n 50]                 # the journal\n"
           "keelway config shop --instance acme.localhost set TIER=gold\n"
           "keelway run blog --instance h.localhost -- python3 manage.py --settings x\n"
           "```\n`keelway up --trusted-proxy=10.0.0.1` and `--purge-data`.\n")
    assert problems(doc) == []


def test_the_readme_is_a_front_page() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines; move reference to docs/"


def test_the_readme_keeps_the_two_quick_start_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
            ".venv/bin/keelway up --demo") in readme
    assert "\nbash .ci/run\n" in readme


def test_the_layering_table_is_the_one_the_layering_test_enforces() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", text, flags=re.MULTILINE)
    table = {layer: set() if allowed.strip() == "nothing else"
             else {name.strip() for name in allowed.split(",")}
             for layer, allowed in rows if layer in ALLOWED}
    assert table == ALLOWED
