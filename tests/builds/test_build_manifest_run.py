"""`run` is the service of `keelway run`'s one-off processes: no Procfile process takes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import load_manifest


def test_a_procfile_process_named_run_is_refused_with_what_to_rename(
        make_app: Callable[..., Path]) -> None:
    with pytest.raises(ManifestError, match=r"`run` names keelway's one-off .*rename it"):
        load_manifest(make_app(procfile="web: python web.py\nrun: python job.py\n"))


def test_a_process_whose_name_only_starts_with_run_is_fine(
        make_app: Callable[..., Path]) -> None:
    manifest = load_manifest(make_app(procfile="web: python web.py\nrunner: python job.py\n"))
    assert sorted(manifest.services) == ["runner", "web"]


def test_a_procfile_process_named_replica_is_refused_it_is_the_replicators(
        make_app: Callable[..., Path]) -> None:
    with pytest.raises(ManifestError, match=r"`replica` names keelway's database replicator"):
        load_manifest(make_app(procfile="web: python web.py\nreplica: python r.py\n"))
