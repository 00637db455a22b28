from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Keelway, free_port


@pytest.fixture
def kw(tmp_path: Path) -> Iterator[Keelway]:
    keelway = Keelway(home=tmp_path / "kh", http_port=free_port())
    yield keelway
    keelway.teardown()
