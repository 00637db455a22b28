"""Durable records: schema, lifecycles, and the SQLite store."""

from keelway.store.store import Conflict, NotFound, Store, StoreError

__all__ = ["Conflict", "NotFound", "Store", "StoreError"]
