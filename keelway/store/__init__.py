"""Durable records: schema, lifecycles, the `Store` protocols and their SQLite store."""

from keelway.store.errors import (
    Conflict,
    DiskFull,
    IllegalTransition,
    NotFound,
    StaleOwner,
    StaleSchedule,
    StoreError,
)
from keelway.store.sqlite import SqliteStore
from keelway.store.store import Store

__all__ = ["Conflict", "DiskFull", "IllegalTransition", "NotFound", "SqliteStore",
           "StaleOwner", "StaleSchedule", "Store", "StoreError"]
