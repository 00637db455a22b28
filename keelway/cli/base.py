"""The `keelway` command group and what every command shares: --json, API errors
turned into one clear line, the API client. Only click and the stdlib load here."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from keelway.cli.client import ApiError, ApiUnavailable, Client
from keelway.cli.output import fail, fail_json
from keelway.home import Home

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_HTTP = "127.0.0.1:8080"


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)


def api_call(func: F) -> F:
    """Turn API and connection failures into one clear error line (or JSON)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return func(*args, **kwargs)
        except ApiUnavailable:
            message = f"keelway is not running for {Home.from_env().root}"
            hint = "start it with `keelway up -d`"
            if as_json:
                fail_json("not-running", message, hint)
            fail(message, hint)
        except ApiError as exc:
            if as_json:
                fail_json(exc.code, exc.message, exc.hint)
            fail(exc.message, exc.hint)

    return wrapper  # type: ignore[return-value]


def client(timeout_s: float | None = 30.0) -> Client:
    return Client(Home.from_env().api_socket, timeout_s)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="keelway")
def cli() -> None:
    """keelway: deploy apps to your own box, with zero downtime."""

