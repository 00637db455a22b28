"""keelway/limits.py: the one record of what a process tree may use, as users write it."""

from __future__ import annotations

import pytest

from keelway.limits import (
    BUILT_IN,
    LimitError,
    Limits,
    format_size,
    parse_count,
    parse_cpu,
    parse_memory,
)


@pytest.mark.parametrize(("written", "size"), [
    ("512M", 512 << 20), ("1G", 1 << 30), ("1.5G", 3 << 29), ("256Mi", 256 << 20),
    ("64MB", 64 << 20), ("2g", 2 << 30), (100_000_000, 100_000_000), (" 1G ", 1 << 30)])
def test_memory_is_read_as_people_write_it(written: str | int, size: int) -> None:
    assert parse_memory(written, "here") == size


@pytest.mark.parametrize(("written", "said"), [
    ("lots", "not an amount of memory"), ("1 0M", "not an amount of memory"),
    ("-5M", "not an amount of memory"), ("8M", "below the 16M"), (0, "below"),
    (True, "not an amount")])
def test_memory_that_cannot_be_taken_says_why(written: str | int, said: str) -> None:
    with pytest.raises(LimitError, match=said):
        parse_memory(written, "[services.web] memory")


def test_cpu_and_counts_are_checked() -> None:
    assert parse_cpu("0.5", "cpu") == 0.5 and parse_cpu(2, "cpu") == 2.0
    for bad in ("half", "0", "nan", "inf", True):
        with pytest.raises(LimitError, match="cpu"):
            parse_cpu(bad, "cpu")  # type: ignore[arg-type]
    assert parse_count(256, "pids", 8) == 256
    for bad in (3, "12", 2.5, True):
        with pytest.raises(LimitError, match="pids"):
            parse_count(bad, "pids", 8)  # type: ignore[arg-type]
    with pytest.raises(LimitError, match="from 64 to 1048576"):
        parse_count(1 << 21, "nofile", 64, 1 << 20)


def test_a_service_limit_wins_and_the_rest_come_from_the_defaults() -> None:
    mine = Limits(memory=256 << 20)
    assert mine.over(BUILT_IN) == Limits(memory=256 << 20, cpu=None, pids=512, nofile=4096)
    box = Limits(cpu=1.0, pids=128)
    assert mine.over(box).over(BUILT_IN) == Limits(256 << 20, 1.0, 128, 4096)
    assert mine.over(box).over(BUILT_IN).describe() == {
        "memory": "256M", "cpu": "1", "pids": "128", "nofile": "4096"}


def test_sizes_are_said_in_their_largest_exact_unit() -> None:
    assert [format_size(s) for s in (1 << 30, 3 << 29, 512 << 20, 1000)] == [
        "1G", "1536M", "512M", "1000"]
