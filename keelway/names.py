"""The rule for every name a user gives keelway, and for config values: one module, so
every layer (the API, the deployer, builds, the home's paths and the router's route
table) accepts exactly the same set (checked by tests/test_names.py).

A leaf with no keelway imports, so the router, which must not depend on the control
plane, imports it too. The rules, and the invariant each one keeps:

- host: a lowercase DNS name without a port or a trailing dot (labels of a-z, 0-9 and
  inner dashes, 1-63 characters each, 253 in all). An accepted host is also one safe
  path component (no `/`, never `.` or `..`), so home.py names files after it, and
  `route_table.host_key` maps every spelling of it in a Host header (any letter case, a
  port, a trailing dot) back onto it.
- app: one DNS label that starts with a letter, so the default host `APP.localhost` is
  always a valid host and `builds/APP` a safe directory.
- service: a Procfile process name, a lowercase letter then a-z, 0-9, `_` or `-`; no
  dot, since log files are named `<service>.<generation>.log`.
- config name: an environment variable name; the names keelway sets itself after the
  app's config (`KEELWAY_*`, `PORT`, `DATABASE_URL`, `NOTIFY_SOCKET`) are refused rather
  than silently overridden.
- seed id: `seed-` and 16 hex digits, minted per import and never reused, so naming
  it names one import; one safe path component (the seed's stored copy is named so).
- fence reason: one line a person reads in `status` and the events, so no control
  characters (no newline to forge a second event line, no terminal escapes).
- snapshot id: the UTC time it was taken to the microsecond, then 4 hex digits
  (`20261201T120102123456Z-9f3a`), so ids sort by time as plain strings (listings,
  `keep`, the newest one) and two snapshots in one microsecond still differ; one safe
  path component and object key segment.
- config value: text that reaches the process unchanged. No NUL (the environment is C
  strings: it would be cut short there), valid UTF-8, and sizes that keep every
  process's environment inside the kernel's exec limits (one string at most 128 KiB,
  all of them a quarter of the stack limit, 2 MiB by default): a value that breaks exec
  would fail every start of the app, long after the config change said yes.

Patterns are matched whole (`fullmatch`), never anchored with `$`, which also matches
before a trailing newline: that is how `"blog.test\\n"` once passed one layer's rule
and not another's.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final


class InvalidName(ValueError):
    """A name or value that its rule refuses. `message` says which and why (never a
    config value itself: it may be a secret); `hint` says what passes."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Rule:
    """A name rule: a whole-string pattern and a length bound, with the words to explain
    it to a user."""

    noun: str
    hint: str
    pattern: re.Pattern[str]
    max_chars: int
    # A host's bound per dot-separated label (the pattern keeps it; this says it).
    max_label_chars: int | None = None

    def accepts(self, value: str) -> bool:
        return len(value) <= self.max_chars and self.pattern.fullmatch(value) is not None

    def check(self, value: str) -> str:
        """`value` itself when the rule accepts it; raises InvalidName otherwise, whose
        message names the bound a too-long value is past."""
        if self.accepts(value):
            return value
        if len(value) > self.max_chars:
            raise InvalidName(f"{_cut(value)} is too long ({len(value)} characters): the "
                              f"limit for {self.noun}s is {self.max_chars}", self.hint)
        if self.max_label_chars is not None:
            long = next((label for label in value.split(".")
                         if len(label) > self.max_label_chars), None)
            if long is not None:
                raise InvalidName(f"{_cut(value)} is not a valid {self.noun}: its label "
                                  f"{_cut(long)} is {len(long)} characters, and the limit "
                                  f"is {self.max_label_chars}", self.hint)
        raise InvalidName(f"{value!r} is not a valid {self.noun}", self.hint)


def _cut(value: str, shown_chars: int = 40) -> str:
    """`value` quoted, its middle left out past `shown_chars`: an error line stays one
    line a person reads, whatever was typed."""
    if len(value) <= shown_chars:
        return repr(value)
    return repr(value[:shown_chars // 2] + "…" + value[-shown_chars // 2:])


_LABEL: Final = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"

HOST: Final = Rule(
    "hostname",
    "use lowercase letters, digits, dots and dashes, like blog.example.com "
    "(no port, no trailing dot, at most 63 characters between dots and 253 in all)",
    re.compile(rf"{_LABEL}(?:\.{_LABEL})*"),
    253,
    max_label_chars=63,
)
APP: Final = Rule(
    "app name",
    "start with a letter; use lowercase letters, digits and dashes, at most 63 "
    "characters, not ending with a dash",
    re.compile("[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"),
    63,
)
SERVICE: Final = Rule(
    "process name",
    "start with a lowercase letter; use lowercase letters, digits, '-' and '_', at "
    "most 63 characters",
    re.compile("[a-z][a-z0-9_-]*"),
    63,
)
CONFIG_NAME: Final = Rule(
    "config var name",
    "use letters, digits and underscores, not starting with a digit, at most 255 "
    "characters",
    re.compile("[A-Za-z_][A-Za-z0-9_]*"),
    255,
)
FENCE_REASON: Final = Rule(
    "fence reason",
    "one line of at most 200 characters, no control characters",
    re.compile(r"[^\x00-\x1f\x7f]+"),
    200,
)

# A seed import's id: minted by keelway (keelway/data/seed.py), never reused, so a
# record, a route row or a `<db>.seed` marker naming it names that one import. It is
# a file name too (the seed's stored copy), so one safe path component.
SEED_ID: Final = Rule(
    "seed id",
    "a seed id as `keelway seed status` shows it: `seed-` and 16 lowercase hex digits",
    re.compile("seed-[0-9a-f]{16}"),
    21,
)

SNAPSHOT_ID: Final = Rule(
    "snapshot id",
    "a snapshot id as `keelway db snapshots HOST` lists it, like 20261201T120102123456Z-9f3a",
    re.compile("[0-9]{8}T[0-9]{12}Z-[0-9a-f]{4}"),
    27,
)


def seed_snapshot(source: str) -> tuple[str | None, str] | None:
    """A seed import's SOURCE as a snapshot: `SNAPID` (of whichever instance holds it)
    or `HOST/SNAPID`, as (host or None, snapshot id); None when SOURCE is not written
    as one (then it is a path to an SQLite file). A `HOST/` that is not a host name is
    refused (InvalidName) rather than taken for a path."""
    head, slash, tail = source.rpartition("/")
    if not SNAPSHOT_ID.accepts(tail):
        return None
    if not slash:
        return None, tail
    if head.startswith((".", "/", "~")) or "/" in head:
        return None  # `./SNAPID`, `/x/SNAPID`, `a/b/SNAPID`: written as a path
    return HOST.check(head), tail


def snapshot_id(epoch_s: float, salt: str) -> str:
    """The id of a snapshot taken at `epoch_s` (UTC); `salt` is 4 hex digits."""
    when = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return SNAPSHOT_ID.check(f"{when:%Y%m%dT%H%M%S%f}Z-{salt}")


# Set by keelway in every process after the app's config (runtime/environment.py), so
# a config var of one of these names could never take effect.
RESERVED_CONFIG_NAMES: Final = frozenset({"PORT", "DATABASE_URL", "NOTIFY_SOCKET"})
RESERVED_CONFIG_PREFIX: Final = "KEELWAY_"

MAX_CONFIG_VALUE_BYTES: Final = 32 * 1024
# The whole config as the environment carries it (NAME=VALUE and a NUL each).
MAX_CONFIG_BYTES: Final = 256 * 1024


def reserved_config_name(name: str) -> bool:
    return name in RESERVED_CONFIG_NAMES or name.startswith(RESERVED_CONFIG_PREFIX)


def check_config_set(name: str, value: str) -> None:
    """A config var a user may set: a valid name keelway does not set itself, and a value
    that passes `check_config_value`; raises InvalidName. (Unsetting needs only a valid
    name: removing a var keelway overrides anyway is harmless.)"""
    CONFIG_NAME.check(name)
    if reserved_config_name(name):
        raise InvalidName(f"{name} is set by keelway itself",
                          "pick another name; keelway sets KEELWAY_*, PORT, DATABASE_URL "
                          "and NOTIFY_SOCKET in every process")
    check_config_value(name, value)


def check_config_value(name: str, value: str) -> str:
    """A value that reaches the process unchanged; raises InvalidName naming the var,
    never the value."""
    if "\0" in value:
        raise InvalidName(f"the value of {name} contains a NUL character",
                          "an environment variable cannot hold NUL; encode binary data "
                          "(base64, say)")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise InvalidName(f"the value of {name} is not valid UTF-8 text",
                          "give the value as UTF-8 text") from None
    if size > MAX_CONFIG_VALUE_BYTES:
        raise InvalidName(f"the value of {name} is {size} bytes, over the limit of "
                          f"{MAX_CONFIG_VALUE_BYTES}",
                          "keep large data in a file in the instance's data dir and put "
                          "its path in config")
    return value


def config_bytes(config: Mapping[str, str]) -> int:
    """What `config` takes of a process's environment."""
    return sum(len(name.encode()) + len(value.encode()) + 2 for name, value in config.items())


def check_config(config: Mapping[str, str]) -> None:
    """A whole config, as a release would carry it: every name and value, and the total;
    raises InvalidName. A reserved name already stored is let be: keelway overrides it."""
    for name, value in config.items():
        CONFIG_NAME.check(name)
        check_config_value(name, value)
    total = config_bytes(config)
    if total > MAX_CONFIG_BYTES:
        raise InvalidName(f"the config would be {total} bytes, over the limit of "
                          f"{MAX_CONFIG_BYTES}",
                          "unset vars you no longer need, or keep large data in a file")
