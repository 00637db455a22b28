"""Fakes for tests (time only: everything else in keelway's tests is real)."""
