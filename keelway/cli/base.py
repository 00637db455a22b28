"""The `keelway` command group and what every command shares: --json, API errors
turned into one clear line, the API client. Only click and the stdlib load here."""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import click

from keelway.cli.client import ApiError, ApiLost, ApiUnavailable, Client
from keelway.cli.output import EXIT_LOST, emit_json, fail, fail_json
from keelway.home import Home

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_HTTP = "127.0.0.1:8080"

# Where a command's request stands after the control plane went away during it, by the
# command's words after `keelway`, filled from its arguments (its groups' too; `{on}` is
# ` --instance H` when it named one). Any other command that changes something points to
# `keelway status`; one that only reads changed nothing.
AFTER_LOST: dict[str, str] = {
    "deploy": "keelway ops {app}",
    "restart": "keelway ops {app}{on}",
    "stop": "keelway ops {app}{on}",
    "start": "keelway ops {app}{on}",
    "rollback": "keelway releases {app}` and `keelway ops {app}",
    "config set": "keelway ops {app}{on}",
    "config unset": "keelway ops {app}{on}",
    "apps create": "keelway apps",
    "apps destroy": "keelway apps",
    "instances add": "keelway instances list {app}",
    "instances remove": "keelway instances list {app}",
    "domains add": "keelway domains list {host}",
    "domains remove": "keelway domains list {host}",
    "park": "keelway status",
    "wake": "keelway status",
    "fence": "keelway status",
    "unfence": "keelway status",
    "seed import": "keelway seed status {host}",
    "seed rollback": "keelway seed status {host}",
    "db snapshot": "keelway db snapshots {host}",
    "db restore": "keelway status` and `keelway db snapshots {host}",
    "router restart": "keelway status",
    "jobs run": "keelway jobs {app}",
    "certs import": "keelway certs list",
}


# Where a `--json` given to any group or command of the line is recorded: click shares
# a context's `meta` with every context below it, so the command that runs sees it.
_JSON_GIVEN = "keelway.json"


def json_given(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """`--json`'s callback at every level: true when this level or one above got it."""
    if value:
        ctx.meta[_JSON_GIVEN] = True
    return bool(value or ctx.meta.get(_JSON_GIVEN))


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, callback=json_given,
                        help="Print JSON.")(func)


def config_pairs(pairs: tuple[str, ...], as_json: bool) -> dict[str, str]:
    """K=V arguments as a dict; a bad one fails the command (exit 2), nothing sent."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            message, hint = f"{pair!r} is not K=V", "write NAME=value"
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        values[name] = value
    return values


def answered(data: dict[str, Any], as_json: bool, dry_run: bool = False) -> bool:
    """Print what needs no words of the command's own: a dry run's plan, or `--json`'s
    answer. True when printed (the command is done)."""
    if dry_run:
        # keelway/cli/plans.py sends dry runs through this module's client: imported
        # here, not at the top, so neither module needs the other to load first.
        from keelway.cli.plans import echo_plan

        echo_plan(data, as_json)
        return True
    if as_json:
        emit_json(data)
        return True
    return False


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
        except ApiLost as exc:
            message, hint = lost_message(exc)
            if as_json:
                fail_json("control-plane-lost", message, hint, EXIT_LOST)
            fail(message, hint, EXIT_LOST)

    return wrapper  # type: ignore[return-value]


def api_command(func: F) -> F:
    """A command that asks the API: it takes --json, and the API's failures end it as one
    clear line (`api_call` reads the flag, so the two always go together)."""
    return json_option(api_call(func))


def instance_path(host: str, *rest: str) -> str:
    """`/v1/instances/HOST/REST...`, each part quoted: the API checks the names, so a bad
    one must reach it intact, not as more of the path."""
    return "/".join(["/v1/instances", *(urllib.parse.quote(p, safe="") for p in (host, *rest))])


def lost_message(exc: ApiLost) -> tuple[str, str]:
    """What is known after the control plane went away during this command's request,
    and where to look: the request may have completed, so nothing is said to have
    failed or succeeded."""
    if exc.method == "GET":
        return (f"{exc.why}; it only read, so nothing was changed",
                "ask again once it is back: `keelway status` says whether it is "
                "(`keelway up -d` starts it)")
    where = "keelway status"
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        words: list[str] = []
        params: dict[str, Any] = {}
        level: click.Context | None = ctx
        while level is not None and level.parent is not None:
            words.insert(0, level.info_name or "")
            params = {**level.params, **params}
            level = level.parent
        instance = params.get("instance")
        params["on"] = f" --instance {instance}" if instance else ""
        template = AFTER_LOST.get(" ".join(words))
        if template is not None:  # every entry names its command's own arguments
            where = template.format(**params)  # (a test formats each one)
    back = ("" if where == "keelway status" else
            "; `keelway status` says whether the control plane is")
    return (f"{exc.why}; it may or may not have completed",
            f"`{where}` says where it stands once the control plane is back{back} "
            "(`keelway up -d` starts it)")


def client(timeout_s: float | None = 30.0) -> Client:
    return Client(Home.from_env().api_socket, timeout_s)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="keelway")
def cli() -> None:
    """keelway: deploy apps to your own box, with zero downtime."""

