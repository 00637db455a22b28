"""Request bodies of the JSON API (msgspec Structs: unknown fields are refused), and the
check of the names and values they carry, by the one rule of each (keelway/names.py).

A check raises `names.InvalidName` (answered 400) before anything is staged or written.
"""

from __future__ import annotations

import msgspec

from keelway import names


class DeployBody(msgspec.Struct, forbid_unknown_fields=True):
    app: str
    source: str
    hosts: list[str] = []
    ref: str | None = None
    git: bool = False
    key: str | None = None
    mode: str | None = None
    dry_run: bool = False  # answer the build and the plans it would run; change nothing
    rollout: dict[str, str] = {}  # this release's [rollout] keys (`--rollout K=V`)

    def check(self) -> None:
        names.APP.check(self.app)
        for host in self.hosts:
            names.HOST.check(host)


class RestartBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None
    key: str | None = None
    dry_run: bool = False  # answer the plan it would run; change nothing


class ConfigBody(msgspec.Struct, forbid_unknown_fields=True):
    set: dict[str, str] = {}
    unset: list[str] = []
    key: str | None = None
    dry_run: bool = False  # answer the plan it would run; change nothing
    rollout: dict[str, str] = {}  # this release's [rollout] keys (`--rollout K=V`)

    def changes(self) -> dict[str, str | None]:
        """The checked changes, None for an unset (a name both unset and set is set)."""
        changes: dict[str, str | None] = {}
        for name in self.unset:
            changes[names.CONFIG_NAME.check(name)] = None
        for name, value in self.set.items():
            names.check_config_set(name, value)
            changes[name] = value
        return changes


class RollbackBody(msgspec.Struct, forbid_unknown_fields=True):
    to: int | None = None
    key: str | None = None
    dry_run: bool = False  # answer the plan it would run; change nothing
    rollout: dict[str, str] = {}  # this release's [rollout] keys (`--rollout K=V`)


class InstanceBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None
    dry_run: bool = False  # answer the plan it would run; change nothing


class DryRunBody(msgspec.Struct, forbid_unknown_fields=True):
    """The body of a request whose one choice is a dry run: park, reconcile, gc, a
    snapshot restore, a seed rollback."""

    dry_run: bool = False  # say what it would do; change nothing


class KeyBody(msgspec.Struct, forbid_unknown_fields=True):
    """The body of a request whose one choice is its idempotency key: a rollout's
    resume or abort."""

    key: str | None = None


class ShutdownBody(msgspec.Struct, forbid_unknown_fields=True):
    keep_apps: bool = False


class CreateAppBody(msgspec.Struct, forbid_unknown_fields=True):
    app: str

    def check(self) -> None:
        names.APP.check(self.app)


class DestroyBody(msgspec.Struct, forbid_unknown_fields=True):
    yes: bool = False
    purge_data: bool = False
    dry_run: bool = False


class AddInstancesBody(msgspec.Struct, forbid_unknown_fields=True):
    hosts: list[str]
    config: dict[str, str] = {}
    parked: bool = False
    dry_run: bool = False


class RemoveInstanceBody(msgspec.Struct, forbid_unknown_fields=True):
    purge_data: bool = False
    dry_run: bool = False


class InstanceConfigBody(msgspec.Struct, forbid_unknown_fields=True):
    set: dict[str, str] = {}
    unset: list[str] = []

    def changes(self) -> dict[str, str | None]:
        changes: dict[str, str | None] = dict.fromkeys(self.unset)
        changes.update(self.set)
        return changes


class AliasesBody(msgspec.Struct, forbid_unknown_fields=True):
    aliases: list[str]
