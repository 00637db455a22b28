"""The certificates the router's HTTPS serves: `keelway certs list`, `keelway certs
import HOST CERT KEY` (your own certificate for a host or alias keelway serves),
`keelway certs renew HOST` (one from the ACME CA now).

    keelway certs import shop.example.com fullchain.pem privkey.pem
    keelway certs renew shop.example.com
    keelway certs list
"""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path

import click

from keelway.cli.base import answered, api_command, cli, client
from keelway.cli.output import fail, fail_json, table
from keelway.cli.plans import dry_run_option


@cli.group()
def certs() -> None:
    """The certificates HTTPS serves (`keelway up --https ADDR`)."""


@certs.command("list")
@api_command
def list_certs(as_json: bool) -> None:
    """Every certificate, the names it covers and when it expires.

    Example: keelway certs list
    """
    data = client().request("GET", "/v1/certs")
    if answered(data, as_json):
        return
    acme = data.get("acme")
    click.echo(f"ordered from {acme['directory']} by {acme['challenge']} as needed"
               if acme else "ACME is off: certificates are the ones imported")
    now = time.time()
    if not data["certificates"]:
        click.echo("no certificates yet" + ("" if acme else
                                            ": `keelway certs import HOST CERT KEY`"))
    else:
        table(None, ["host", "covers", "issuer", "expires", ""],
              [[c["name"], ", ".join(c["names"]), c["issuer"],
                time.strftime("%Y-%m-%d", time.gmtime(c["not_after"])),
                _left(c["not_after"] - now) + ("" if c["served"] else "; not served")]
               for c in data["certificates"]])
    for held in data.get("failing") or []:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(held["retry_at"]))
        click.echo(f"{held['name']}: not issued ({held['failures']} tries): {held['error']}; "
                   f"tried again after {at}, or now with `keelway certs renew "
                   f"{held['name']}`")


def _read(path: Path, as_json: bool) -> str:
    """A PEM file's text, or the command fails saying which file and why (never a byte
    of it: it may be the key)."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not PEM text"
        message, hint = (f"cannot read {path}: {why}",
                         "give the PEM files of the certificate and its key")
        if as_json:
            fail_json("bad-request", message, hint)
        fail(message, hint)


def _left(seconds: float) -> str:
    days = int(seconds // 86400)
    return "expired" if seconds <= 0 else f"in {days} days" if days else "today"


@certs.command("import")
@click.argument("host")
@click.argument("cert", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("key", type=click.Path(dir_okay=False, path_type=Path))
@api_command
def import_cert(host: str, cert: Path, key: Path, as_json: bool) -> None:
    """Serve HOST over HTTPS with your own certificate: CERT is the certificate and its
    chain (PEM), KEY its private key (PEM, no passphrase).

    Example: keelway certs import shop.example.com fullchain.pem privkey.pem
    """
    pem, secret = _read(cert, as_json), _read(key, as_json)
    data = client().request("POST", f"/v1/certs/{urllib.parse.quote(host, safe='')}",
                            {"certificate": pem, "key": secret})
    if answered(data, as_json):
        return
    expires = time.strftime("%Y-%m-%d", time.gmtime(data["not_after"]))
    click.echo(f"{host} is served with the certificate from {data['issuer']} "
               f"(covers {', '.join(data['names'])}; expires {expires})")


@certs.command("renew")
@click.argument("host")
@dry_run_option
@api_command
def renew(host: str, dry_run: bool, as_json: bool) -> None:
    """Order a new certificate for HOST from the ACME CA now, as a journaled operation
    (whatever its back-off); the one served meanwhile stays served.

    Example: keelway certs renew shop.example.com
    """
    data = client(None).request(
        "POST", f"/v1/certs/{urllib.parse.quote(host, safe='')}/renew", {"dry_run": dry_run})
    if answered(data, as_json, dry_run):
        return
    cert = data.get("certificate")
    if cert is None:
        click.echo(f"{host}: renewed")
        return
    expires = time.strftime("%Y-%m-%d", time.gmtime(cert["not_after"]))
    click.echo(f"{host} is served with a new certificate from {cert['issuer']} "
               f"(expires {expires})")
