"""Request bodies of the JSON API (msgspec Structs: unknown fields are refused)."""

from __future__ import annotations

import msgspec


class DeployBody(msgspec.Struct, forbid_unknown_fields=True):
    app: str
    source: str
    hosts: list[str] = []
    ref: str | None = None
    git: bool = False
    key: str | None = None
    mode: str | None = None


class RestartBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None
    key: str | None = None


class ConfigBody(msgspec.Struct, forbid_unknown_fields=True):
    set: dict[str, str] = {}
    unset: list[str] = []
    key: str | None = None


class RollbackBody(msgspec.Struct, forbid_unknown_fields=True):
    to: int | None = None
    key: str | None = None


class ReconcileBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


class InstanceBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None


class GcBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


class ShutdownBody(msgspec.Struct, forbid_unknown_fields=True):
    keep_apps: bool = False
