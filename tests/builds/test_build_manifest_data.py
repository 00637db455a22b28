"""keelway.toml's [data] table: the snapshot schedule and how many are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import DEFAULT_KEEP_SNAPSHOTS, DataSpec, load_manifest


def _app(tmp_path: Path, toml: str | None) -> Path:
    (tmp_path / "Procfile").write_text("web: python3 web.py\n")
    if toml is not None:
        (tmp_path / "keelway.toml").write_text(toml)
    return tmp_path


def test_an_app_without_a_data_table_snapshots_only_by_hand(tmp_path: Path) -> None:
    assert load_manifest(_app(tmp_path, None)).data == DataSpec(None, DEFAULT_KEEP_SNAPSHOTS)


def test_the_data_table_sets_the_schedule_and_the_count_kept(tmp_path: Path) -> None:
    found = load_manifest(_app(tmp_path, '[data]\nsnapshot_every = "1h"\nkeep = 3\n'))
    assert found.data == DataSpec(3600.0, 3)


@pytest.mark.parametrize(("toml", "says"), [
    ('[data]\nsnapshot_evry = "1h"\n', "snapshot_evry"),
    ('[data]\nsnapshot_every = "soon"\n', "not a duration"),
    ('[data]\nsnapshot_every = "5s"\n', "under a minute"),
    ("[data]\nkeep = 0\n", "at least 1"),
    ('[data]\nkeep = "many"\n', "keep"),
])
def test_a_bad_data_table_is_refused_with_what_to_change(tmp_path: Path, toml: str,
                                                          says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        load_manifest(_app(tmp_path, toml))
