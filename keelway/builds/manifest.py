"""The app contract: a Procfile plus an optional keelway.toml, read into a `Manifest`.

Owns: parsing and validating both files, and the defaults of every service setting (they
live here and nowhere else). Pure apart from reading the two files: no process, no
write.

Rules:
- A Procfile line is `name: command`; `#` starts a comment line; blank lines are skipped.
  Names follow keelway/names.py's SERVICE rule and are unique. `release` is the one-shot
  release command, not a service; `run` is reserved for one-off processes (`keelway
  run`). A `web` process is required: keelway routes HTTP to it.
- keelway.toml holds `[build]` (`command`; `memory`, `timeout`, `disk`: the build's own
  limits, each at most the box's), `[services.<name>]` tables with `mode`,
  `health`, `ready_timeout` (a web's time to answer its health path; more than zero),
  `settle`, `stop_grace`, `idle`, `park_after`, and `[data]` with `drill_every`,
  `snapshot_every` (a
  duration; none: no scheduled snapshots) and `keep` (snapshots kept per instance, at
  least 1, default 24). Unknown keys and services not in the
  Procfile are errors, so a typo never silently falls back to a default.
- Every problem raises `ManifestError` with a message naming the file (and line, where
  there is one) and what to change. Validation never uses `assert`.
- No Procfile but a package.json with a `start` script: the web is `npm start`, as
  Heroku's Node buildpack has it. `[releases] keep` (at least 1, default 10) is how many
  of an app's newest releases keep their builds from gc.
- `[rollout]` is how a release reaches an app's instances (`RolloutSpec`): a canary,
  then cohorts reaching a growing share of them, each judged on its traffic;
  `cohort_sizes` turns it into the cohorts for a number of instances.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

import msgspec

from keelway import cron, journal, limits, names
from keelway.builds.errors import ManifestError
from keelway.limits import (
    MAX_NOFILE,
    MIN_NOFILE,
    MIN_PIDS,
    BuildLimits,
    LimitError,
    Limits,
    parse_count,
    parse_cpu,
    parse_memory,
)

PROCFILE = "Procfile"
CONFIG_FILE = "keelway.toml"
RELEASE = "release"
WEB = "web"
# The service of `keelway run`'s one-off processes (keelway/deploy/runs.py): no Procfile
# process may take it, or a one-off would pass for a generation of that service.
ONE_OFF = "run"
# The service of an instance's replicator (keelway/data/replicas.py), reserved like
# ONE_OFF so its generation record is never taken for an app process of that name.
REPLICA = journal.REPLICA

DEFAULT_HEALTH = "/"
DEFAULT_READY_TIMEOUT_S = 60.0
DEFAULT_SETTLE_S = 10.0
DEFAULT_STOP_GRACE_S = 10.0
# An idle instance is frozen first (memory kept, a wake in milliseconds), then parked
# this much later (keelway/activator/sweep.py).
DEFAULT_PARK_AFTER_S = 15 * 60.0
DEFAULT_DRILL_EVERY_S = 86400.0
DEFAULT_KEEP_SNAPSHOTS = 24
DEFAULT_KEEP_RELEASES = 10
DEFAULT_ROLLOUT_PARALLEL = 8
MAX_CONCURRENCY = 100_000
# No extra watch by default: a cohort is judged on its traffic from its start to the end
# of its instances' settle windows (10 s each by default), and an app that wants longer
# says `bake` (a bake holds every cohort boundary of every release that long).
DEFAULT_ROLLOUT_BAKE_S = 0.0

_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)%")


class ServiceKind(Enum):
    WEB = "web"  # gets a port claim and is routed
    WORKER = "worker"  # socketless


class Mode(Enum):
    OVERLAP = "overlap"  # start the new generation, then retire the old one
    HOLD = "hold"  # never two alive: stop the old one first, hold traffic meanwhile


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    command: str
    kind: ServiceKind
    mode: Mode
    health: str = DEFAULT_HEALTH
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    settle_s: float = DEFAULT_SETTLE_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    idle_s: float | None = None  # None: never park
    # After `idle`, how long it stays frozen before it parks (0: it parks at once).
    park_after_s: float = DEFAULT_PARK_AFTER_S
    # Its own bounds (keelway/limits.py); each one unset is the box's default.
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class DataSpec:
    """How an app's instance databases are snapshotted (keelway/deploy/restore.py)."""

    snapshot_every_s: float | None = None  # None: only by hand
    keep: int = DEFAULT_KEEP_SNAPSHOTS
    # How often each instance's newest snapshot and replica are restored and verified
    # without anyone asking (keelway/deploy/drill_schedule.py).
    drill_every_s: float = DEFAULT_DRILL_EVERY_S


class NoTraffic(Enum):
    """What a cohort's judgement is when its instances had no request during bake: an
    outcome of its own, so a quiet cohort is never taken for a healthy or a failing one."""

    PASS = "pass"  # the next cohort starts (the outcome is recorded as "no traffic")
    WAIT = "wait"  # bake goes on until traffic comes
    HALT = "halt"  # the rollout halts, for a person to resume or abort


@dataclass(frozen=True, slots=True)
class Amount:
    """A number of things, or (`percent` set) a percentage of however many there are."""

    count: int = 0
    percent: Fraction | None = None

    def of(self, total: int) -> int:
        """How many of `total` this is: a percentage rounded up (10% of 3 instances is
        one instance, never none), never more than `total`."""
        if self.percent is None:
            return min(self.count, total)
        return min(total, math.ceil(self.percent * total / 100))

    def allows(self, part: int, total: int) -> bool:
        """Whether `part` of `total` is within this as a budget (a percentage: at most
        that share, unrounded; a count: at most that many)."""
        if self.percent is None:
            return part <= self.count
        return part * 100 <= self.percent * total

    def __str__(self) -> str:
        return str(self.count) if self.percent is None else f"{self.percent}%"


_ALL: Amount = Amount(percent=Fraction(100))


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """How a release reaches an app's instances (issue #19): `canary` instances first,
    then each of `cohorts` brings the instances on the release up to that many (or that
    share), the last all of them; at most `parallel` instances start at once; a cohort
    passes once its instances settled and, over `bake_s`, the router's 5xx answers for
    them stayed within `max_5xx` (a share of their responses, or a count)."""

    canary: Amount = Amount(count=1)
    cohorts: tuple[Amount, ...] = (Amount(percent=Fraction(10)),
                                   Amount(percent=Fraction(50)), _ALL)
    parallel: int = DEFAULT_ROLLOUT_PARALLEL
    bake_s: float = DEFAULT_ROLLOUT_BAKE_S
    max_5xx: Amount = Amount(percent=Fraction(1))
    on_no_traffic: NoTraffic = NoTraffic.PASS


def cohort_sizes(rollout: RolloutSpec, instances: int) -> list[int]:
    """The sizes of a rollout's cohorts over `instances` instances, canary first: each
    at least 1, summing to `instances` (none for none). A cohort that would add no
    instance (10% of 3 is one instance, which the canary already is) is left out."""
    sizes: list[int] = []
    reached = 0
    for step in (rollout.canary, *rollout.cohorts):
        target = step.of(instances)
        if target > reached:
            sizes.append(target - reached)
            reached = target
    if reached < instances:  # a spec is refused unless its last cohort is 100%
        sizes.append(instances - reached)
    return sizes


@dataclass(frozen=True, slots=True)
class Manifest:
    services: dict[str, ServiceSpec]
    release_command: str | None = None
    build_command: str | None = None
    data: DataSpec = DataSpec()
    # releases kept per app, their builds pinned (gc: keelway/store/builds.py)
    releases_keep: int = DEFAULT_KEEP_RELEASES
    rollout: RolloutSpec = RolloutSpec()
    # What its builds may use ([build] memory, timeout, disk); each one unset is the
    # box's, which is also each one's ceiling (keelway/limits.py).
    build_limits: BuildLimits = field(default_factory=BuildLimits)
    # Requests in flight to one instance at once through the router ([http]
    # max_concurrency; keelway/router/concurrency.py); None: the router's default.
    http_max_concurrency: int | None = None
    # [http] force_https: plain HTTP is redirected to HTTPS (where the router serves it);
    # hsts: how long browsers are told to use HTTPS only (None: not told).
    http_force_https: bool = False
    http_hsts_s: int | None = None
    # Scheduled jobs ([jobs.NAME]; keelway/deploy/jobs.py), by name.
    jobs: dict[str, JobSpec] = field(default_factory=dict)


# keelway.toml as written by the user; turned into ServiceSpecs by `_apply`.
class _BuildTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    command: str | None = None
    memory: str | int | None = None
    timeout: str | float | None = None
    disk: str | int | None = None


class _ServiceTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    mode: str | None = None
    health: str | None = None
    ready_timeout: str | float | None = None
    settle: str | float | None = None
    stop_grace: str | float | None = None
    idle: str | float | None = None
    park_after: str | float | None = None
    memory: str | int | None = None
    cpu: str | float | None = None
    pids: int | None = None
    nofile: int | None = None


class _DataTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    snapshot_every: str | float | None = None
    keep: int | None = None
    drill_every: str | float | None = None


class _ReleasesTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    keep: int | None = None


class _RolloutTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    canary: int | str | None = None
    cohorts: list[int | str] | None = None
    parallel: int | None = None
    bake: str | float | None = None
    max_5xx: int | str | None = None
    on_no_traffic: str | None = None


class _HttpTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    max_concurrency: int | None = None
    force_https: bool = False
    hsts: str | float | None = None


class _ConfigFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    build: _BuildTable | None = None
    services: dict[str, dict[str, object]] = {}
    data: _DataTable | None = None
    releases: _ReleasesTable | None = None
    rollout: _RolloutTable | None = None
    http: _HttpTable | None = None
    jobs: dict[str, dict[str, object]] = {}


@dataclass(frozen=True, slots=True)
class _Config:
    build_command: str | None = None
    build_limits: BuildLimits = field(default_factory=BuildLimits)
    services: dict[str, _ServiceTable] = field(default_factory=dict)
    data: _DataTable | None = None
    releases_keep: int | None = None
    rollout: _RolloutTable | None = None
    http: _HttpTable | None = None
    jobs: dict[str, _JobTable] = field(default_factory=dict)


def load_manifest(directory: Path) -> Manifest:
    """Read `directory/Procfile` and, if present, `directory/keelway.toml`.

    Returns a fully defaulted Manifest; raises ManifestError for anything a user must fix.
    """
    directory = Path(directory)
    procfile = directory / PROCFILE
    if procfile.is_file():
        commands = parse_procfile(_read_text(procfile))
    elif (start := _npm_start(directory)) is not None:
        commands = {WEB: start}  # as Heroku's Node buildpack: `npm start` is the web
    else:
        raise ManifestError(
            f"no {PROCFILE} at the top of the app: add one with a line like "
            "`web: python -m myapp` (the web process listens on 127.0.0.1:$PORT)"
        )
    config_path = directory / CONFIG_FILE
    config = _Config()
    if config_path.is_file():
        config = _parse_config(config_path.read_bytes())
    return _apply(commands, config)


def _npm_start(directory: Path) -> str | None:
    """`npm start` when package.json has a `start` script, for an app with no Procfile."""
    try:
        package = msgspec.json.decode((directory / "package.json").read_bytes())
    except (OSError, msgspec.DecodeError):
        return None  # no package.json, or one the build's install step will refuse
    scripts = package.get("scripts") if isinstance(package, dict) else None
    start = scripts.get("start") if isinstance(scripts, dict) else None
    return "npm start" if isinstance(start, str) and start.strip() else None


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path.name} is not UTF-8 text (byte {exc.start})") from exc


def parse_procfile(text: str) -> dict[str, str]:
    """Parse Procfile text into {name: command}, in file order, `release` included."""
    commands: dict[str, str] = {}
    seen_on: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, command = line.partition(":")
        name, command = name.strip(), command.strip()
        where = f"{PROCFILE} line {lineno}"
        if not sep:
            raise ManifestError(f"{where}: expected `name: command`, got {line!r}")
        if not names.SERVICE.accepts(name):
            raise ManifestError(f"{where}: process name {name!r} is not valid: "
                                f"{names.SERVICE.hint}")
        if not command:
            raise ManifestError(f"{where}: process {name!r} has no command after the ':'")
        if name in seen_on:
            raise ManifestError(
                f"{where}: process {name!r} is already defined on line {seen_on[name]}; "
                "rename or remove one of them"
            )
        seen_on[name] = lineno
        commands[name] = command
    return commands


def _parse_config(data: bytes) -> _Config:
    """Decode keelway.toml bytes; syntax, type and unknown-key errors become ManifestError.

    Service tables are converted one by one so that an error names its table: msgspec
    reports a dict key only as `[...]`.
    """
    try:
        top = msgspec.toml.decode(data, type=_ConfigFile)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{CONFIG_FILE}{_where(str(exc), tables=True)}") from exc
    except msgspec.DecodeError as exc:
        raise ManifestError(f"{CONFIG_FILE}: not valid TOML: {exc}") from exc
    return _Config(build_command=top.build.command if top.build else None,
                   build_limits=_build_limits(top.build),
                   services=_named_tables(top.services, _ServiceTable, "services"),
                   data=top.data, releases_keep=top.releases.keep if top.releases else None,
                   rollout=top.rollout, http=top.http,
                   jobs=_named_tables(top.jobs, _JobTable, "jobs"))


_Table = TypeVar("_Table", bound=msgspec.Struct)


def _named_tables(raw: dict[str, dict[str, object]], kind: type[_Table],
                  section: str) -> dict[str, _Table]:
    """`[section.NAME]` tables, each converted on its own so that an error names it."""
    tables: dict[str, _Table] = {}
    for name, table in raw.items():
        try:
            tables[name] = msgspec.convert(table, type=kind)
        except msgspec.ValidationError as exc:
            raise ManifestError(f"{CONFIG_FILE} [{section}.{name}]{_where(str(exc))}") from exc
    return tables


def _where(message: str, *, tables: bool = False) -> str:
    """Turn msgspec's `X - at `$.a.b`` into ` a.b: X` (or ` [a.b]: X` for tables)."""
    text, _sep, path = message.partition(" - at `$")
    path = path.rstrip("`").lstrip(".").replace("[...]", ".<name>")
    if not path:
        return f": {text}"
    return f" [{path}]: {text}" if tables else f" {path}: {text}"


def parse_duration_s(value: str | float, *, where: str) -> float:
    """`"500ms"`, `"10s"`, `"15m"`, `"1h"`, `"1m30s"`, or a number of seconds -> seconds
    (the grammar is keelway/limits.py's, which `keelway up`'s flags share)."""
    try:
        return limits.parse_duration_s(value, where)
    except LimitError as exc:
        raise ManifestError(str(exc)) from None


def _apply(commands: dict[str, str], config: _Config) -> Manifest:
    if WEB not in commands:
        raise ManifestError(
            f"{PROCFILE} has no `web` process, and keelway routes HTTP to `web`: add a line "
            "like `web: python -m myapp` that listens on 127.0.0.1:$PORT"
        )
    if ONE_OFF in commands:
        raise ManifestError(
            f"{PROCFILE}: `{ONE_OFF}` names keelway's one-off processes (`keelway run`), "
            "so no process may be called that; rename it (for example `runner`)"
        )
    if REPLICA in commands:
        raise ManifestError(
            f"{PROCFILE}: `{REPLICA}` names keelway's database replicator, so no process "
            "may be called that; rename it (for example `replicator`)"
        )
    service_names = [name for name in commands if name != RELEASE]
    for name in config.services:
        if name == RELEASE:
            raise ManifestError(
                f"{CONFIG_FILE} [services.{RELEASE}]: `release` is a one-shot command, not a "
                "service, and takes no settings; remove this table"
            )
        if name not in commands:
            raise ManifestError(
                f"{CONFIG_FILE} [services.{name}]: the {PROCFILE} has no process {name!r} "
                f"(it has: {', '.join(service_names)}); fix the name or add it to the "
                f"{PROCFILE}"
            )
    services = {
        name: _service(name, commands[name], config.services.get(name)) for name in service_names
    }
    build_command = config.build_command
    if build_command is not None and not build_command.strip():
        raise ManifestError(f"{CONFIG_FILE} [build]: command is empty; remove it or fill it in")
    return Manifest(
        services=services,
        release_command=commands.get(RELEASE),
        build_command=build_command,
        data=_data(config.data),
        releases_keep=_releases_keep(config.releases_keep),
        rollout=_rollout(config.rollout),
        build_limits=config.build_limits,
        http_max_concurrency=_max_concurrency(config.http),
        http_force_https=config.http.force_https if config.http is not None else False,
        http_hsts_s=_hsts(config.http),
        jobs={name: _job(name, table) for name, table in config.jobs.items()},
    )


def _hsts(table: _HttpTable | None) -> int | None:
    if table is None or table.hsts is None:
        return None
    where = f"{CONFIG_FILE} [http] hsts"
    seconds = round(parse_duration_s(table.hsts, where=where))
    if seconds < 1:
        raise ManifestError(f"{where}: {table.hsts!r} must be at least a second (\"1y\" is "
                            "usual); remove it to send no Strict-Transport-Security")
    return seconds


def _max_concurrency(table: _HttpTable | None) -> int | None:
    if table is None or table.max_concurrency is None:
        return None
    try:
        return parse_count(table.max_concurrency, f"{CONFIG_FILE} [http] max_concurrency", 1,
                           MAX_CONCURRENCY)
    except LimitError as exc:
        raise ManifestError(str(exc)) from None


def _releases_keep(keep: int | None) -> int:
    if keep is None:
        return DEFAULT_KEEP_RELEASES
    if keep < 1:
        raise ManifestError(f"{CONFIG_FILE} [releases] keep: {keep} must be at least 1 (the "
                            "current release is always kept)")
    return keep


# `--rollout KEY=VALUE` on deploy, config and rollback: which keys, and which field of
# RolloutSpec each one sets.
ROLLOUT_KEYS: dict[str, str] = {"canary": "canary", "cohorts": "cohorts",
                                "parallel": "parallel", "bake": "bake_s",
                                "max_5xx": "max_5xx", "on_no_traffic": "on_no_traffic"}


def overlay_rollout(spec: RolloutSpec, pairs: Mapping[str, str]) -> RolloutSpec:
    """`spec` (an app's `[rollout]`) with the keys of `pairs` in its place: one release's
    `--rollout KEY=VALUE`, each value as keelway.toml writes it (`cohorts` comma
    separated), checked by the same rules; ManifestError naming the key otherwise."""
    if not pairs:
        return spec
    unknown = sorted(set(pairs) - set(ROLLOUT_KEYS))
    if unknown:
        raise ManifestError(f"--rollout {unknown[0]}: not a key of [rollout] (one of "
                            f"{', '.join(ROLLOUT_KEYS)})")
    raw: dict[str, object] = {}
    for key, value in pairs.items():
        if key == "cohorts":
            raw[key] = [_count_or_text(v.strip()) for v in value.split(",")]
        elif key in ("canary", "max_5xx", "parallel"):
            raw[key] = _count_or_text(value.strip())
        else:
            raw[key] = value.strip()
    try:
        table = msgspec.convert(raw, type=_RolloutTable)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"--rollout{_where(str(exc))}") from exc
    given = _rollout(table, "--rollout")
    return dataclasses.replace(spec, **{ROLLOUT_KEYS[k]: getattr(given, ROLLOUT_KEYS[k])
                                        for k in pairs})


def _count_or_text(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def _rollout(table: _RolloutTable | None, where: str = f"{CONFIG_FILE} [rollout]"
             ) -> RolloutSpec:
    default = RolloutSpec()
    if table is None:
        return default
    canary = default.canary
    if table.canary is not None:
        canary = _amount(table.canary, f"{where} canary", "a number of instances")
    cohorts = default.cohorts
    if table.cohorts is not None:
        cohorts = _cohorts(table.cohorts, f"{where} cohorts")
    parallel = default.parallel if table.parallel is None else table.parallel
    if parallel < 1:
        raise ManifestError(f"{where} parallel: {parallel} must be at least 1 (instances "
                            "started at once)")
    max_5xx = default.max_5xx
    if table.max_5xx is not None:
        max_5xx = _amount(table.max_5xx, f"{where} max_5xx", "a number of responses")
    on_no_traffic = default.on_no_traffic
    if table.on_no_traffic is not None:
        try:
            on_no_traffic = NoTraffic(table.on_no_traffic)
        except ValueError:
            allowed = ", ".join(f'"{m.value}"' for m in NoTraffic)
            raise ManifestError(f"{where} on_no_traffic: {table.on_no_traffic!r} is not one "
                                f"of {allowed}") from None
    return RolloutSpec(canary=canary, cohorts=cohorts, parallel=parallel,
                       bake_s=_duration_or(table.bake, default.bake_s, f"{where} bake"),
                       max_5xx=max_5xx, on_no_traffic=on_no_traffic)


def _amount(value: int | str, where: str, count_of: str) -> Amount:
    """`3` or `"25%"` (0 to 100, decimals allowed) as an Amount."""
    if isinstance(value, int):
        if value < 0:
            raise ManifestError(f"{where}: {value} must be 0 or more ({count_of}), or a "
                                'percentage like "10%"')
        return Amount(count=value)
    found = _PERCENT_RE.fullmatch(value.strip())
    percent = Fraction(found.group(1)) if found else None
    if percent is None or percent > 100:
        raise ManifestError(f"{where}: {value!r} is neither {count_of} nor a percentage "
                            'from "0%" to "100%" (like "10%")')
    return Amount(percent=percent)


def _cohorts(values: list[int | str], where: str) -> tuple[Amount, ...]:
    """Cohorts reach growing shares of the instances, the last all of them. Counts and
    percentages may mix; each kind must grow (which of `5` and `"10%"` is more depends
    on how many instances there are: `cohort_sizes` leaves out a cohort adding none)."""
    hint = 'like ["10%", "50%", "100%"]'
    if not values:
        raise ManifestError(f"{where}: is empty; list the cohorts, {hint}, or remove it")
    cohorts = tuple(_amount(v, f"{where}[{i}]", "a number of instances")
                    for i, v in enumerate(values))
    percents = [c.percent for c in cohorts if c.percent is not None]
    counts = [Fraction(c.count) for c in cohorts if c.percent is None]
    for sizes in (percents, counts):
        if any(later <= earlier for earlier, later in itertools.pairwise(sizes)):
            raise ManifestError(f"{where}: {values!r} must grow from one cohort to the "
                                f"next, {hint}")
    if cohorts[-1] != _ALL:
        raise ManifestError(f'{where}: the last cohort must be "100%" (every instance), '
                            f"{hint}; it is {values[-1]!r}")
    if any(c.of(1) == 0 for c in cohorts):  # of one instance: none only for 0 or "0%"
        raise ManifestError(f"{where}: {values!r} has an empty cohort (0 or \"0%\"); "
                            f"every cohort brings at least one more instance, {hint}")
    return cohorts


def _data(table: _DataTable | None) -> DataSpec:
    if table is None:
        return DataSpec()
    where = f"{CONFIG_FILE} [data]"
    every_s = None
    if table.snapshot_every is not None:
        every_s = parse_duration_s(table.snapshot_every, where=f"{where} snapshot_every")
        if every_s < 60:
            raise ManifestError(f"{where} snapshot_every: {table.snapshot_every!r} is under "
                                'a minute; write at least "1m", or remove it to snapshot '
                                "only by hand")
    keep = DEFAULT_KEEP_SNAPSHOTS if table.keep is None else table.keep
    if keep < 1:
        raise ManifestError(f"{where} keep: {keep} must be at least 1 (the newest snapshot "
                            "is always kept)")
    drill_s = DEFAULT_DRILL_EVERY_S
    if table.drill_every is not None:
        drill_s = parse_duration_s(table.drill_every, where=f"{where} drill_every")
        if drill_s < 60:
            raise ManifestError(f"{where} drill_every: {table.drill_every!r} is under a "
                                'minute; write at least "1m" (default "1d")')
    return DataSpec(snapshot_every_s=every_s, keep=keep, drill_every_s=drill_s)


def _service(name: str, command: str, table: _ServiceTable | None) -> ServiceSpec:
    kind = ServiceKind.WEB if name == WEB else ServiceKind.WORKER
    mode = Mode.OVERLAP if kind is ServiceKind.WEB else Mode.HOLD
    if table is None:
        return ServiceSpec(name=name, command=command, kind=kind, mode=mode)
    where = f"{CONFIG_FILE} [services.{name}]"
    if table.mode is not None:
        try:
            mode = Mode(table.mode)
        except ValueError:
            allowed = ", ".join(m.value for m in Mode)
            raise ManifestError(f"{where} mode: {table.mode!r} is not one of {allowed}") from None
    health = DEFAULT_HEALTH if table.health is None else table.health
    if not health.startswith("/") or any(ch.isspace() or not ch.isprintable() for ch in health):
        raise ManifestError(
            f"{where} health: {health!r} must be an HTTP path starting with '/', "
            'without spaces, like "/healthz"'
        )
    ready_timeout_s = _duration_or(table.ready_timeout, DEFAULT_READY_TIMEOUT_S,
                                   f"{where} ready_timeout")
    if ready_timeout_s == 0:
        raise ManifestError(f"{where} ready_timeout: must be longer than zero; remove it "
                            f"for the default ({DEFAULT_READY_TIMEOUT_S:g}s)")
    idle_s = None
    if table.idle is not None:
        idle_s = parse_duration_s(table.idle, where=f"{where} idle")
        if idle_s == 0:
            raise ManifestError(
                f"{where} idle: must be longer than zero; remove `idle` to never park"
            )
    return ServiceSpec(
        name=name,
        command=command,
        kind=kind,
        mode=mode,
        health=health,
        ready_timeout_s=ready_timeout_s,
        settle_s=_duration_or(table.settle, DEFAULT_SETTLE_S, f"{where} settle"),
        stop_grace_s=_duration_or(table.stop_grace, DEFAULT_STOP_GRACE_S, f"{where} stop_grace"),
        idle_s=idle_s,
        park_after_s=_duration_or(table.park_after, DEFAULT_PARK_AFTER_S,
                                  f"{where} park_after"),
        limits=_limits(table, where),
    )


def _build_limits(table: _BuildTable | None) -> BuildLimits:
    """The app's own build limits; the box's fill the rest and bound these (stage.py)."""
    if table is None:
        return BuildLimits()
    where = f"{CONFIG_FILE} [build]"
    try:
        return BuildLimits(
            memory=(parse_memory(table.memory, f"{where} memory")
                    if table.memory is not None else None),
            timeout_s=(limits.parse_build_timeout(table.timeout, f"{where} timeout")
                       if table.timeout is not None else None),
            disk=(limits.parse_build_disk(table.disk, f"{where} disk")
                  if table.disk is not None else None))
    except LimitError as exc:
        raise ManifestError(str(exc)) from None


def _limits(table: _ServiceTable, where: str) -> Limits:
    """The service's own bounds; the box's defaults fill the rest where it runs."""
    try:
        return Limits(
            memory=(parse_memory(table.memory, f"{where} memory")
                    if table.memory is not None else None),
            cpu=parse_cpu(table.cpu, f"{where} cpu") if table.cpu is not None else None,
            pids=(parse_count(table.pids, f"{where} pids", MIN_PIDS)
                  if table.pids is not None else None),
            nofile=(parse_count(table.nofile, f"{where} nofile", MIN_NOFILE, MAX_NOFILE)
                    if table.nofile is not None else None))
    except LimitError as exc:
        raise ManifestError(str(exc)) from None


def _duration_or(value: str | float | None, default_s: float, where: str) -> float:
    return default_s if value is None else parse_duration_s(value, where=where)


# -- scheduled jobs ([jobs.NAME]) -------------------------------------------------------

# A job's generations are of service `job.NAME` (its logs `job.NAME.<gen>.log`): a dot is
# in no Procfile name, so a job's processes are never taken for a service's.
JOB_SERVICE_PREFIX = "job."
DEFAULT_MISSED_WINDOW_S = 24 * 3600.0
# At most this many catch-up runs of one job on one instance (`missed = "all"`).
MAX_CATCH_UP = 100


class Overlap(Enum):
    """A run falls due while the job's previous run on the instance still runs."""

    SKIP = "skip"  # this run is not started (said in events)
    QUEUE = "queue"  # it starts once the previous one has ended
    REPLACE = "replace"  # the previous one is stopped, then this one starts


class Missed(Enum):
    """Runs whose time passed while keelway was down (within `missed_window`)."""

    SKIP = "skip"  # none of them runs
    ONCE = "once"  # the latest runs once
    ALL = "all"  # each runs, oldest first, one after another


class Reach(Enum):
    """Which of the app's instances run the job."""

    EACH = "each"
    ONE = "one"  # the first instance by name that may run it: app-wide work


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    command: str
    schedule: cron.Schedule
    instances: Reach = Reach.EACH
    overlap: Overlap = Overlap.SKIP
    missed: Missed = Missed.ONCE
    missed_window_s: float = DEFAULT_MISSED_WINDOW_S
    wake: bool = False
    # Each instance's run starts at its scheduled time plus a jitter in [0, spread), the
    # same for the same run every time it is computed (keelway/deploy/jobs.py).
    spread_s: float = 0.0
    # A run still going after this long is stopped (None: it may run as long as it runs).
    timeout_s: float | None = None

    @property
    def service(self) -> str:
        return JOB_SERVICE_PREFIX + self.name


class _JobTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    schedule: str
    command: str
    timezone: str = "UTC"
    instances: str = Reach.EACH.value
    overlap: str = Overlap.SKIP.value
    missed: str = Missed.ONCE.value
    missed_window: str | float | None = None
    wake: bool = False
    spread: str | float | None = None
    timeout: str | float | None = None


def _job(name: str, table: _JobTable) -> JobSpec:
    where = f"{CONFIG_FILE} [jobs.{name}]"
    if not names.SERVICE.accepts(name):
        raise ManifestError(f"{where}: {name!r} is not a valid job name; {names.SERVICE.hint}")
    if not table.command.strip():
        raise ManifestError(f"{where} command: is empty; write the command the job runs")
    try:
        schedule = cron.parse(table.schedule, table.timezone)
    except cron.CronError as exc:
        raise ManifestError(f"{where} schedule: {exc}") from None
    missed_window_s = _duration_or(table.missed_window, DEFAULT_MISSED_WINDOW_S,
                                   f"{where} missed_window")
    timeout_s = (None if table.timeout is None
                 else parse_duration_s(table.timeout, where=f"{where} timeout"))
    if timeout_s == 0:
        raise ManifestError(f"{where} timeout: must be longer than zero; remove it to let "
                            "runs take as long as they take")
    spread_s = _duration_or(table.spread, 0.0, f"{where} spread")
    # A spread reaching the next run would start one run after its successor is due.
    gap = _shortest_gap_s(schedule)
    if spread_s >= gap:
        raise ManifestError(f"{where} spread: {table.spread!r} is not shorter than the "
                            f"{gap:g}s between runs of {table.schedule!r}; make it shorter")
    return JobSpec(
        name=name, command=table.command, schedule=schedule,
        instances=_choice(Reach, table.instances, f"{where} instances"),
        overlap=_choice(Overlap, table.overlap, f"{where} overlap"),
        missed=_choice(Missed, table.missed, f"{where} missed"),
        missed_window_s=missed_window_s, wake=table.wake, spread_s=spread_s,
        timeout_s=timeout_s)


_E = TypeVar("_E", Reach, Overlap, Missed)


def _choice(kind: type[_E], value: str, where: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(f'"{m.value}"' for m in kind)
        raise ManifestError(f"{where}: {value!r} is not one of {allowed}") from None


def _shortest_gap_s(schedule: cron.Schedule) -> float:
    """The shortest time between two runs over the next few fires (a bound for
    `spread`; an exact minimum over all time is not needed for that)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fires = schedule.between(start, start + timedelta(days=800), 64)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    return min(gaps, default=math.inf)
