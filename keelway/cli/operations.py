"""Commands that change things: deploy, restart, rollback, config, stop/start,
reconcile, gc. Long ones stream their progress; every one takes --json."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from keelway.cli.base import answered, api_call, api_command, cli, client, config_pairs, json_option
from keelway.cli.output import EXIT_LOST, emit_json, fail, fail_json, shown_value
from keelway.cli.plans import dry_run_operation, dry_run_option
from keelway.names import CONFIG_NAME


def run_operation(path: str, body: dict[str, Any], as_json: bool, what: str,
                  app: str) -> dict[str, Any]:
    """POST a streaming operation: progress lines to stderr, then its result or error.
    A failed build's output is shown once: streamed, or in the error when nothing was."""
    streamed = False
    for item in client(None).stream("POST", path, body):
        if item["event"] == "progress":
            if not as_json:
                click.echo(f"-> {item['message']}", err=True)
                streamed = True
        elif item["event"] == "error":
            err = item["error"]
            if item.get("replayed") and not as_json:
                click.echo("(replayed: this key already ran)", err=True)
            if as_json:
                fail_json(err["code"], err["message"], err.get("hint"))
            fail(err["summary"] if streamed and "summary" in err else err["message"],
                 err.get("hint"))
        elif item["event"] == "result":
            result: dict[str, Any] = item["result"]
            if as_json:
                emit_json(result | ({"replayed": True} if item.get("replayed") else {}))
            else:
                if item.get("replayed"):
                    click.echo("(replayed: this key already ran)", err=True)
                click.echo(f"{what}")
                for inst in result.get("instances", []):
                    click.echo(f"  {inst['release']}  {inst['url']}")
            return result
    # Its outcome is as unknown as after a lost connection, and exits the same.
    message = (f"the control plane closed the {path} request without a result; it may or "
               "may not have completed")
    hint = (f"`keelway ops {app}` says where it stands once the control plane is back "
            "(`keelway up -d` starts it); see $KEELWAY_HOME/logs/keelway.log")
    if as_json:
        fail_json("control-plane-lost", message, hint, EXIT_LOST)
    fail(message, hint, EXIT_LOST)


key_option = click.option("--key", default=None,
                          help="Idempotency key: a repeat replays the recorded outcome.")
rollout_option = click.option(
    "--rollout", "rollout", multiple=True, metavar="KEY=VALUE",
    help="This release's [rollout] key over keelway.toml's (canary, cohorts, parallel, "
         "bake, max_5xx, on_no_traffic; repeatable; cohorts comma separated).")


def rollout_pairs(pairs: tuple[str, ...], as_json: bool) -> dict[str, str]:
    """`--rollout KEY=VALUE`s as the API takes them; the daemon checks the values."""
    found: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            message, hint = f"--rollout {pair!r} is not KEY=VALUE", "like --rollout parallel=16"
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        found[key.strip()] = value
    return found


@cli.command()
@click.argument("app")
@click.argument("source", type=click.Path())
@click.option("--host", "hosts", multiple=True, help="A hostname to serve (repeatable).")
@click.option("--ref", default=None, help="Deploy this git ref of SOURCE.")
@click.option("--git", "use_git", is_flag=True, help="Deploy SOURCE's git HEAD, not its files.")
@click.option("--mode", type=click.Choice(["overlap", "hold"]), default=None,
              help="Swap every service this way (default: per service, from keelway.toml).")
@rollout_option
@key_option
@dry_run_option
@json_option
@api_call
def deploy(app: str, source: str, hosts: tuple[str, ...], ref: str | None, use_git: bool,
           mode: str | None, rollout: tuple[str, ...], key: str | None, dry_run: bool,
           as_json: bool) -> None:
    """Build SOURCE (a directory, tarball or git repo) and release it to APP.

    With --dry-run: the build it would stage (or reuse) and each instance's plan; nothing
    is built, recorded or started."""
    path = Path(source).expanduser().absolute()
    if not path.exists():
        message, hint = f"{source} does not exist", "give a directory, a tarball or a git repo"
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)
    body = {"app": app, "source": str(path), "hosts": list(hosts), "ref": ref, "git": use_git,
            "key": key, "mode": mode, "rollout": rollout_pairs(rollout, as_json)}
    if dry_run:
        return dry_run_operation("/v1/deploy", body, as_json)
    run_operation("/v1/deploy", body, as_json, f"deployed {app}", app)


@cli.command()
@click.argument("app")
@click.option("--instance", default=None, help="Only this hostname.")
@key_option
@dry_run_option
@api_command
def restart(app: str, instance: str | None, key: str | None, dry_run: bool,
            as_json: bool) -> None:
    """Start new processes of what APP runs (overlap or hold per service)."""
    body = {"instance": instance, "key": key}
    if dry_run:
        return dry_run_operation(f"/v1/apps/{app}/restart", body, as_json)
    run_operation(f"/v1/apps/{app}/restart", body, as_json, f"restarted {app}", app)


@cli.command()
@click.argument("app")
@click.argument("release", required=False)
@rollout_option
@key_option
@dry_run_option
@api_command
def rollback(app: str, release: str | None, rollout: tuple[str, ...], key: str | None,
             dry_run: bool, as_json: bool) -> None:
    """Release the build and config of an older release (default: the one before)."""
    number: int | None = None
    if release is not None:
        digits = release[1:] if release.startswith("v") else release
        if not digits.isdigit():
            message, hint = f"{release!r} is not a release", "name one like v3"
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        number = int(digits)
    if dry_run:
        return dry_run_operation(f"/v1/apps/{app}/rollback", {"to": number}, as_json)
    run_operation(f"/v1/apps/{app}/rollback",
                  {"to": number, "key": key, "rollout": rollout_pairs(rollout, as_json)},
                  as_json, f"rolled back {app}", app)


class _ConfigGroup(click.Group):
    """`config APP --instance H set K=V`: click stops reading a group's options at its
    first argument, so the group's own options right after APP move in front of it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        front: list[str] = []
        rest = list(args[1:])
        while rest:
            if rest[0] == "--instance" and len(rest) >= 2:
                front += rest[:2]
                rest = rest[2:]
            elif rest[0].startswith("--instance=") or rest[0] == "--json":
                front.append(rest.pop(0))
            else:
                break
        return super().parse_args(ctx, [*front, *args[:1], *rest] if args else args)


@cli.group(cls=_ConfigGroup, invoke_without_command=True)
@click.argument("app")
@click.option("--instance", default=None,
              help="The config of this instance, layered over the app's.")
@click.pass_context
@api_command
def config(ctx: click.Context, app: str, instance: str | None, as_json: bool) -> None:
    """Show APP's config vars, or change them: `config APP set K=V`, `config APP unset K`;
    with --instance H, H's own vars (layered over the app's; H restarts per mode)."""
    ctx.obj = (app, instance)
    if ctx.invoked_subcommand is not None:
        return
    if instance is not None:
        data = client().request("GET", f"/v1/apps/{app}/instances/{instance}/config")
        if answered(data, as_json):
            return
        for name, value in sorted(data["effective"].items()):
            source = "instance" if name in data["config"] else "app"
            click.echo(f"{name}={shown_value(value)}  ({source})")
        if not data["effective"]:
            click.echo(f"{instance} has no config vars; set one with "
                       f"`keelway config {app} --instance {instance} set K=V`")
        return
    data = client().request("GET", f"/v1/apps/{app}/config")
    if answered(data, as_json):
        return
    if not data["config"]:
        click.echo(f"{app} has no config vars; set one with `keelway config {app} set K=V`")
    for name, value in sorted(data["config"].items()):
        click.echo(f"{name}={shown_value(value)}")


def _instance_config(app: str, instance: str, body: dict[str, Any], as_json: bool,
                     what: str) -> None:
    data = client(None).request("POST", f"/v1/apps/{app}/instances/{instance}/config", body)
    if answered(data, as_json):
        return
    said = [what]
    if data["restarted"]:
        said.append(f"restarted {', '.join(data['restarted'])}")
    if data.get("parked"):
        said.append(f"{', '.join(data['parked'])} stays parked and takes it at its next wake")
    click.echo("; ".join(said))


def _dry_config(app: str, instance: str | None, body: dict[str, Any],
                as_json: bool) -> None:
    if instance is not None:
        message, hint = ("--dry-run plans an app's config release", "drop --instance")
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)
    dry_run_operation(f"/v1/apps/{app}/config", body, as_json)


def _change_options(func: Callable[..., None]) -> Callable[..., None]:
    """What `config set` and `config unset` both take: the group's (APP, --instance),
    --rollout, --key, --dry-run and --json."""
    return rollout_option(key_option(dry_run_option(click.pass_obj(api_command(func)))))


def _change(obj: tuple[str, str | None], change: dict[str, Any], said: str,
            key: str | None, dry_run: bool, as_json: bool,
            rollout: tuple[str, ...] = ()) -> None:
    """A set or an unset: a dry run plans the app's config release; with --instance the
    instance's own vars change (it restarts per mode); else the app's config is released
    as an operation."""
    app, instance = obj
    if dry_run:
        return _dry_config(app, instance, change, as_json)
    if instance is not None:
        if rollout:
            message, hint = ("--rollout is for an app's release, not one instance's vars",
                             "drop --rollout or --instance")
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
        return _instance_config(app, instance, change, as_json, f"{said} on {instance}")
    run_operation(f"/v1/apps/{app}/config",
                  change | {"key": key, "rollout": rollout_pairs(rollout, as_json)}, as_json,
                  f"{said} on {app}", app)


@config.command("set")
@click.argument("pairs", nargs=-1, required=True)
@_change_options
def config_set(obj: tuple[str, str | None], pairs: tuple[str, ...], rollout: tuple[str, ...],
               key: str | None, dry_run: bool, as_json: bool) -> None:
    """Set K=V (a new release; processes restart per mode)."""
    values = config_pairs(pairs, as_json)
    _change(obj, {"set": values}, f"set {', '.join(values)}", key, dry_run, as_json, rollout)


@config.command("unset")
@click.argument("names", nargs=-1, required=True)
@_change_options
def config_unset(obj: tuple[str, str | None], names: tuple[str, ...],
                 rollout: tuple[str, ...], key: str | None, dry_run: bool,
                 as_json: bool) -> None:
    """Remove config vars (a new release). Names none of which is set change nothing
    and make no release."""
    if not dry_run and _none_set(obj, names, as_json):
        return
    _change(obj, {"unset": list(names)}, f"unset {', '.join(names)}", key, dry_run, as_json,
            rollout)


def _none_set(obj: tuple[str, str | None], names: tuple[str, ...], as_json: bool) -> bool:
    """Whether none of `names` is set where the unset would remove it (the app's config,
    or with --instance the instance's own): then nothing is sent, and it says so. A
    name its rule refuses is refused here, before anything is read."""
    app, instance = obj
    for name in names:
        if not CONFIG_NAME.accepts(name):
            message, hint = f"{name!r} is not a valid {CONFIG_NAME.noun}", CONFIG_NAME.hint
            if as_json:
                fail_json("bad-request", message, hint)
            fail(message, hint)
    path = (f"/v1/apps/{app}/instances/{instance}/config" if instance is not None
            else f"/v1/apps/{app}/config")
    where = instance if instance is not None else app
    config = client().request("GET", path)["config"]
    if any(name in config for name in names):
        return False
    if as_json:
        emit_json({"app": app, "instance": instance, "unset": [], "not_set": list(names),
                   "release": None})
    else:
        click.echo(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not set on "
                   f"{where}: nothing changed, no release made")
    return True


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only say what it would do.")
@api_command
def reconcile(dry_run: bool, as_json: bool) -> None:
    """Converge every instance, as boot does (leftovers, interrupted operations)."""
    data = client(None).request("POST", "/v1/reconcile", {"dry_run": dry_run})
    if answered(data, as_json):
        return
    verb = "would" if dry_run else "did"
    quiet = True
    for item in data["instances"]:
        for action in item["actions"]:
            click.echo(f"{item['instance']}: {verb} {action}")
            quiet = False
        if item["error"]:
            click.echo(f"{item['instance']}: {item['error']}")
            quiet = False
    if quiet:
        click.echo("nothing to do: every instance is converged")


def _instance_command(verb: str) -> Callable[..., None]:
    @click.argument("app")
    @click.option("--instance", default=None, help="Only this hostname.")
    @dry_run_option
    @api_command
    def command(app: str, instance: str | None, dry_run: bool, as_json: bool) -> None:
        data = client(None).request("POST", f"/v1/apps/{app}/{verb}",
                                    {"instance": instance, "dry_run": dry_run})
        if answered(data, as_json, dry_run):
            return
        done = data["stopped" if verb == "stop" else "started"]
        click.echo(f"{verb}{'ped' if verb == 'stop' else 'ed'} {', '.join(done) or 'nothing'}")

    command.__doc__ = f"{verb.capitalize()} the app's instances (or one with --instance)."
    return command


cli.command("stop")(_instance_command("stop"))
cli.command("start")(_instance_command("start"))


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@api_command
def gc(dry_run: bool, as_json: bool) -> None:
    """Remove staged builds that no kept release (`[releases] keep`, default 10; the
    ACTIVE and last good ones always) or process names, the dependency cache entries no
    build uses, each instance's
    snapshots beyond its `[data] keep`, and the copies restores kept, once past their
    retention (7 days unless KEELWAY_KEEP_REPLACED_DAYS says otherwise)."""
    data = client(None).request("POST", "/v1/gc", {"dry_run": dry_run})
    if answered(data, as_json):
        return
    verb = "would remove" if dry_run else "removed"
    snapshots = data.get("snapshots_removed", [])
    aged = data.get("kept_removed", [])
    cached = data.get("cache_removed", [])
    if not data["removed"] and not snapshots and not aged and not cached:
        click.echo("nothing to remove")
    for item in data["removed"]:
        click.echo(f"{verb} {item['app']} build {item['digest'][:12]} "
                   f"({_size(item.get('freed_bytes', 0))})")
    for item in cached:
        click.echo(f"{verb} dependency cache entry {item['key'][:12]} "
                   f"({_size(item['freed_bytes'])})")
    for item in snapshots:
        click.echo(f"{verb} snapshot {item['id']} of {item['instance']}")
    for item in aged:
        click.echo(f"{verb} kept copy {item['id']} of {item['instance']}")
    if data.get("freed_bytes"):
        builds, entries = len(data["removed"]), len(cached)
        click.echo(f"{'would free' if dry_run else 'freed'} {_size(data['freed_bytes'])} "
                   f"in {builds} build{'' if builds == 1 else 's'} and {entries} cache "
                   f"entr{'y' if entries == 1 else 'ies'}")


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KB", "MB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"

