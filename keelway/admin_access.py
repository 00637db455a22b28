"""Who may read the admin listener (`keelway up --admin ADDR`): the one token rule.

Rules:
- A listener bound to loopback (127.0.0.0/8, ::1, `localhost`) answers anyone who can
  reach it: only this box can, as it can already read the home.
- Any other bind address needs KEELWAY_ADMIN_TOKEN in the control plane's environment,
  or the listener does not start (`required_token` raises): an address others can reach
  never serves the fleet's state to whoever asks.
- With a token, a request is let in only with `Authorization: Bearer TOKEN` or the
  `keelway_admin` cookie holding it (set by `/login`), compared with
  `hmac.compare_digest`, so the time an answer takes says nothing of how much of a guess
  was right.
- The token itself is never logged nor answered; callers say only *that* it was wrong.

A leaf (no keelway imports), so the rule can be tested, and read, on its own.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from typing import Final

TOKEN_ENV: Final = "KEELWAY_ADMIN_TOKEN"
COOKIE: Final = "keelway_admin"
# Shorter is guessable over a network in a day of tries; say so rather than serve.
MIN_TOKEN_CHARS: Final = 16


class AdminAccessError(Exception):
    """The listener's settings cannot be served safely (the operator's to fix)."""


class Access(enum.Enum):
    ALLOWED = "allowed"
    # No token offered, or the wrong one: 401 either way (the same answer, so a prober
    # learns nothing from which it was).
    DENIED = "denied"


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches only this box. A name other than `localhost` is
    not loopback by this rule: what it resolves to can change under the listener."""
    bare = host.strip("[]")
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def required_token(host: str, environ: dict[str, str]) -> str | None:
    """The token requests to a listener bound on `host` must carry (None: none, the
    listener is on loopback). Raises AdminAccessError off loopback without one, or with
    one too short to hold off a guesser; the message never contains the token."""
    token = environ.get(TOKEN_ENV, "")
    if is_loopback(host):
        # A token set anyway is honoured: an operator who set it meant it.
        return token or None
    if not token:
        raise AdminAccessError(
            f"--admin {host} is not a loopback address: set {TOKEN_ENV} in the "
            "environment of `keelway up` (every request must then carry it), or bind "
            "127.0.0.1")
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminAccessError(f"{TOKEN_ENV} is shorter than {MIN_TOKEN_CHARS} characters")
    return token


def decide(token: str | None, authorization: str | None, cookie: str | None) -> Access:
    """Whether a request carrying `authorization` (its Authorization header) and
    `cookie` (its keelway_admin cookie) may be answered, when `token` is required."""
    if token is None:
        return Access.ALLOWED
    offered = [cookie or ""]
    if authorization is not None:
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() == "bearer":
            offered.append(credential.strip())
    expected = token.encode()
    # Every offer compared, whichever matched, so the time taken does not say which.
    matched = False
    for candidate in offered:
        matched |= hmac.compare_digest(candidate.encode(), expected)
    return Access.ALLOWED if matched else Access.DENIED
