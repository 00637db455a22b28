"""`[releases] keep` in keelway.toml: how many releases keep their builds from gc."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import DEFAULT_KEEP_RELEASES, load_manifest


def _app(tmp_path: Path, toml: str | None) -> Path:
    (tmp_path / "Procfile").write_text("web: python3 -m http.server $PORT\n")
    if toml is not None:
        (tmp_path / "keelway.toml").write_text(toml)
    return tmp_path


def test_releases_keep_defaults_to_ten_and_reads_the_table(tmp_path: Path) -> None:
    assert load_manifest(_app(tmp_path, None)).releases_keep == DEFAULT_KEEP_RELEASES == 10
    assert load_manifest(_app(tmp_path, "[releases]\nkeep = 3\n")).releases_keep == 3


@pytest.mark.parametrize(("toml", "message"), [
    ("[releases]\nkeep = 0\n", "keep: 0 must be at least 1"),
    ('[releases]\nkeep = "all"\n', "releases.keep"),
    ("[releases]\nkept = 3\n", "kept"),
])
def test_a_bad_releases_table_is_refused_naming_the_key(tmp_path: Path, toml: str,
                                                         message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        load_manifest(_app(tmp_path, toml))
