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


# Past this many rows a table is printed as plain columns: rich lays out every row to
# fit the terminal (`status --all` of 10,000 instances: some 8 s of the 9), and a
# listing that long is read through grep or a pager, not fitted to a screen.
PLAIN_FROM_ROWS = 500


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if len(rows) >= PLAIN_FROM_ROWS:
        _plain_table(title, columns, rows)
        return
    from rich.console import Console
    from rich.table import Table

    grid = Table(title=title, show_edge=False, header_style="bold")
    first = max([len(str(row[0])) for row in rows] + [len(columns[0]) if columns else 0])
    for at, column in enumerate(columns):
        # The first column names the row (a host, an app): never cut or wrapped, so a
        # narrow terminal squeezes the others, never a name.
        grid.add_column(column, no_wrap=at == 0, min_width=(first or None) if at == 0 else None)
    for row in rows:
        grid.add_row(*["" if v is None else str(v) for v in row])
    console = Console()
    # rich crops the whole table to the console's width, the first column too: a
    # terminal narrower than the name and a sliver of every other column gets the lines
    # wider than itself (it wraps them) rather than a cut name.
    needed = first + 3 + sum(min(len(c), 8) + 3 for c in columns[1:])
    if console.width < needed:
        console = Console(width=needed)
    console.print(grid)


def _plain_table(title: str | None, columns: Sequence[str],
                 rows: Sequence[Sequence[Any]]) -> None:
    """The table as left-aligned columns two spaces apart, every cell whole."""
    cells = [list(columns), *(["" if v is None else str(v) for v in row] for row in rows)]
    widths = [max(len(row[at]) for row in cells) for at in range(len(columns))]
    lines = [title] if title else []
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip() for row in cells]
    lines.insert(len(lines) - len(rows), "  ".join("-" * width for width in widths))
    click.echo("\n".join(lines))


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


# How many instances a page of `status` and `instances list` shows: the API's own
# default (keelway/api/status.py PER_PAGE), named here so the CLI sends no page size.
PER_PAGE = 20


def paging_options(func: Any) -> Any:
    """`--all` and `--page K`, as `status` and `instances list` take them."""
    func = click.option("--page", type=click.IntRange(min=1), default=None, metavar="K",
                        help=f"Show page K of the instances ({PER_PAGE} a page).")(func)
    return click.option("--all", "show_all", is_flag=True,
                        help="Show every instance, not a page of them.")(func)


def page_query(show_all: bool, page: int | None, as_json: bool) -> str:
    """The query that asks for what the flags say: a page, or every instance. The
    human view pages by default; `--json` answers every instance unless `--page` asks
    for one, as it always has, so the scripts that read it see them all."""
    if show_all and page is not None:
        message, hint = "--all and --page ask for different things", "give one of them"
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)
    if show_all or (as_json and page is None):
        return ""
    return f"page={page or 1}"


def page_line(page: dict[str, int] | None, command: str) -> str | None:
    """What a page leaves out and how to see it (None: it left nothing out); `command`
    is the one that showed it, to which the flags are added."""
    if page is None or page["pages"] <= 1:
        return None
    first = (page["number"] - 1) * page["size"] + 1
    last = min(page["total"], page["number"] * page["size"])
    shown = (f"instances {first}-{last} of {page['total']}" if first <= page["total"]
             else f"no instances on page {page['number']}")
    if page["number"] < page["pages"]:
        return (f"{shown} (page {page['number']} of {page['pages']}): `{command} --page "
                f"{page['number'] + 1}` for the next, `{command} --all` for every one")
    return (f"{shown} (page {page['number']} of {page['pages']}): `{command} --all` for "
            "every one")


def state_counts(summary: dict[str, Any]) -> str:
    """`10000 instances: 9990 parked, 10 running; 2 need attention`."""
    states = sorted(summary["states"].items(), key=lambda kv: (-kv[1], kv[0]))
    said = plural(summary["instances"], "instance", "instances")
    if states:
        said += ": " + ", ".join(f"{count} {state}" for state, count in states)
    if summary["attention"]:
        said += f"; {summary['attention']} need{'s' if summary['attention'] == 1 else ''} " \
                "attention"
    return said
