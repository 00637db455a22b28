"""What every command's `--help` ends with, and `--json` wherever it is typed.

`finish(cli)` runs once, after every command module has registered its commands
(keelway/cli/main.py): it gives each command its example from `EXAMPLES`, and each
group that has no `--json` of its own one that only records the flag, so
`keelway --json status`, `keelway db --json snapshots H` and `keelway status --json`
all answer in JSON. Rules:
- One example per command, in one table: a command missing from it fails
  tests/cli/test_papercuts.py, as does an example naming a flag the command lacks.
- `--json` given at any level holds for the command that runs (click's `meta` is
  shared by a context and every context below it; base.json_given reads it).
"""

from __future__ import annotations

import click

from keelway.cli.base import json_given

EXAMPLES: dict[str, str] = {
    "": "keelway --json status",
    "apps": "keelway apps --json",
    "apps create": "keelway apps create shop",
    "apps destroy": "keelway apps destroy shop --yes --purge-data",
    "certs": "keelway certs list",
    "certs list": "keelway certs list --json",
    "certs import": "keelway certs import blog.example.com fullchain.pem privkey.pem",
    "certs renew": "keelway certs renew blog.example.com --dry-run",
    "db": "keelway db snapshots acme.blog.localhost",
    "db snapshot": "keelway db snapshot acme.blog.localhost",
    "db snapshots": "keelway db snapshots acme.blog.localhost --json",
    "db verify": "keelway db verify acme.blog.localhost 20261201T120102123456Z-9f3a",
    "db restore": "keelway db restore acme.blog.localhost 20261201T120102123456Z-9f3a",
    "db kept": "keelway db kept acme.blog.localhost",
    "db forget": "keelway db forget acme.blog.localhost COPY",
    "db replicas": "keelway db replicas acme.blog.localhost",
    "db drill": "keelway db drill acme.blog.localhost",
    "doctor": "keelway doctor --json",
    "domains": "keelway domains list acme.shop.localhost",
    "domains add": "keelway domains add acme.shop.localhost www.acme.localhost",
    "domains remove": "keelway domains remove acme.shop.localhost www.acme.localhost",
    "domains list": "keelway domains list acme.shop.localhost",
    "install-service": "keelway install-service --user root --print -- --http 0.0.0.0:80",
    "instances": "keelway instances list shop",
    "instances add": "keelway instances add shop acme.shop.localhost --config TIER=gold",
    "instances remove": "keelway instances remove shop acme.shop.localhost --purge-data",
    "instances list": "keelway instances list shop --all",
    "jobs": "keelway jobs list blog",
    "jobs list": "keelway jobs list blog --json",
    "jobs run": "keelway jobs run blog nightly --instance acme.blog.localhost",
    "up": "keelway up -d --http 127.0.0.1:8080",
    "down": "keelway down --keep-apps",
    "router": "keelway router restart",
    "router restart": "keelway router restart",
    "deploy": "keelway deploy blog ./app --host blog.localhost",
    "restart": "keelway restart blog --instance acme.blog.localhost",
    "rollback": "keelway rollback blog v3",
    "config": "keelway config blog --instance acme.blog.localhost",
    "config set": "keelway config blog set GREETING=hi",
    "config unset": "keelway config blog unset GREETING",
    "reconcile": "keelway reconcile --dry-run",
    "stop": "keelway stop blog --instance acme.blog.localhost",
    "start": "keelway start blog",
    "gc": "keelway gc --dry-run",
    "park": "keelway park acme.blog.localhost",
    "freeze": "keelway freeze acme.blog.localhost",
    "wake": "keelway wake acme.blog.localhost",
    "fence": "keelway fence acme.blog.localhost --reason 'moving it'",
    "unfence": "keelway unfence acme.blog.localhost",
    "status": "keelway status blog --page 2",
    "logs": "keelway logs blog --service web -n 50 -f",
    "events": "keelway events blog -f",
    "ops": "keelway ops blog -n 20",
    "releases": "keelway releases blog",
    "rollout": "keelway rollout status blog",
    "rollout status": "keelway rollout status blog --json",
    "rollout pause": "keelway rollout pause blog",
    "rollout resume": "keelway rollout resume blog",
    "rollout abort": "keelway rollout abort blog",
    "run": "keelway run blog --instance acme.blog.localhost -- python3 manage.py migrate",
    "seed": "keelway seed status acme.blog.localhost",
    "seed import": "keelway seed import acme.blog.localhost ./copy.sqlite3 --dry-run",
    "seed rollback": "keelway seed rollback acme.blog.localhost",
    "seed status": "keelway seed status acme.blog.localhost",
}


def commands(group: click.Group) -> list[tuple[str, click.Command]]:
    """Every command under `group`, itself first, by its words after `keelway`."""
    found: list[tuple[str, click.Command]] = [("", group)]
    for name, sub in group.commands.items():
        if isinstance(sub, click.Group):
            found += [(f"{name} {path}".strip(), cmd) for path, cmd in commands(sub)]
        else:
            found.append((name, sub))
    return found


def finish(cli: click.Group) -> None:
    """Each command's example as the end of its help; `--json` on every group."""
    for path, command in commands(cli):
        example = EXAMPLES.get(path)
        if example is not None:
            # \b: click prints the paragraph as written, never rewrapped.
            command.epilog = f"\b\nExample: {example}"
        if isinstance(command, click.Group) and not any(
                "--json" in param.opts for param in command.params
                if isinstance(param, click.Option)):
            command.params.append(click.Option(
                ["--json"], is_flag=True, expose_value=False, callback=json_given,
                help="Print JSON (for the command that runs)."))
