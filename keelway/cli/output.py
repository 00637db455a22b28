"""How the CLI prints: JSON when asked, otherwise short lines and rich tables.

rich is imported only when a table is drawn, so commands that print a line stay fast.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import click

# The CLI's exit codes, one meaning each (README, "Exit codes"). A command's own outcome
# that is not an error (`seed rollback` that held) exits EXIT_FAILED too.
EXIT_FAILED = 1  # an error, said on stderr (or as JSON): what failed and what to do
EXIT_ALREADY_RUNNING = 3  # `up -d` while a control plane serves this home
# The control plane went away (or stopped answering) during a request: it may or may not
# have done it. Like ssh's, a code a command's own cannot be mistaken for: `run` exits
# with its command's code otherwise.
EXIT_LOST = 255


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def fail(message: str, hint: str | None = None, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    if hint:
        click.echo(f"  next: {hint}", err=True)
    sys.exit(code)


def fail_json(code_name: str, message: str, hint: str | None,
              code: int = EXIT_FAILED) -> NoReturn:
    emit_json({"error": {"code": code_name, "message": message, "hint": hint}})
    sys.exit(code)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    grid = Table(title=title, show_edge=False, header_style="bold")
    for at, column in enumerate(columns):
        # The first column names the row (a host, an app): never cut or wrapped, so a
        # narrow terminal squeezes the others, never a name.
        widest = max((len(str(row[0])) for row in rows), default=0) if at == 0 else 0
        grid.add_column(column, no_wrap=at == 0, min_width=max(widest, len(column)) or None)
    for row in rows:
        grid.add_row(*["" if v is None else str(v) for v in row])
    Console().print(grid)


def ago(at: float | None) -> str:
    if at is None:
        return ""
    seconds = max(0, int(time.time() - at))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return f"{seconds // 86400}d ago"


def plural(count: int, one: str, many: str) -> str:
    """`1 process`, `2 processes`, `0 processes`."""
    return f"{count} {one if count == 1 else many}"


def shown_value(value: str) -> str:
    """A config value as one line: quoted, escaped as JSON does, when it holds a line
    break or another control character (or would read differently unquoted, with
    whitespace at either end), so a value never spills onto a line of its own."""
    if value != value.strip() or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value) \
            or value.startswith('"'):
        return json.dumps(value, ensure_ascii=False)
    return value
