"""Instance data: object stores, snapshots and their verification.

Layering: data imports the store, runtime, builds and the leaf modules; deploy imports
data, never the reverse (tests/test_layering.py). An *instance's* database (KEELWAY_DB)
is opened here with sqlite3; keelway's own store never is (tests/store/test_boundary.py).
"""
