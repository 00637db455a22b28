"""An app's logs merged in time order: service lines timed by the control plane's
samples (keelway/runtime/log_times.py), access-log lines by their own stamps, across
instances, with `since` and a total line count. Real files in tmp_path, real mtimes."""

from __future__ import annotations

import os
from pathlib import Path

from keelway.api.app_logs import Source, merged, tail
from keelway.router.access_log import ACCESS_LOG_NAME, encode_frame
from keelway.runtime.log_times import Sampler, Timeline, times_path
from keelway.runtime.logs import rotate_if_large

T0 = 1_700_000_000.0


def write_at(path: Path, text: str, at: float, sampler: Sampler, apps: Path) -> None:
    """Append `text` as if written at `at`, then let the sampler see it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)
    os.utime(path, (at, at))
    sampler.sample(apps)


def access_frame(at: float, path: str) -> bytes:
    """One record, written as the router writes its batches (router/access_log.py): its
    times on the monotonic clock, with the wall clock's offset in the frame."""
    offset = 1_000_000.0
    return encode_frame(offset, ["a.test", 1, at - offset, at - offset + 0.001, b"GET",
                                 path.encode(), 200, 10, -1.0, b"127.0.0.1"])


def test_two_instances_services_and_access_logs_merge_in_time_order_with_since_and_n(
        tmp_path: Path) -> None:
    apps = tmp_path / "logs" / "apps"
    sampler = Sampler()
    a_web, b_web = apps / "a.test" / "web.1.log", apps / "b.test" / "web.2.log"
    a_worker = apps / "a.test" / "worker.1.log"
    write_at(a_web, "a web booted\n", T0 + 1, sampler, apps)
    write_at(b_web, "b web booted\n", T0 + 2, sampler, apps)
    write_at(a_worker, "a worker one\n", T0 + 3, sampler, apps)
    write_at(a_web, "a web serving\n", T0 + 5, sampler, apps)
    write_at(b_web, "b web serving\n", T0 + 6, sampler, apps)
    for instance, at, path in (("a.test", T0 + 4.5, "/a1"), ("b.test", T0 + 5.5, "/b1"),
                               ("a.test", T0 + 7.25, "/a2")):
        log = apps / instance / ACCESS_LOG_NAME
        with log.open("ab") as handle:
            handle.write(access_frame(at, path))
    sources = [Source("a.test", "web", 1, a_web), Source("a.test", "worker", 1, a_worker),
               Source("b.test", "web", 2, b_web),
               Source("a.test", "router", None, apps / "a.test" / ACCESS_LOG_NAME),
               Source("b.test", "router", None, apps / "b.test" / ACCESS_LOG_NAME)]

    lines, offsets = merged(sources, 100, None)
    assert [line.text.split(" ")[3] if line.source.service == "router" else line.text
            for line in lines] == [
        "a web booted", "b web booted", "a worker one", "/a1", "a web serving", "/b1",
        "b web serving", "/a2"]
    assert [line.at for line in lines] == sorted(line.at for line in lines)
    assert offsets[a_web] == a_web.stat().st_size

    since, _ = merged(sources, 100, T0 + 5)
    assert [line.at >= T0 + 5 for line in since] == [True] * 4
    assert len(since) == 4 and since[0].text == "a web serving"

    newest, _ = merged(sources, 3, None)
    assert [line.source.service for line in newest] == ["router", "web", "router"]
    assert newest[-1].text.split(" ")[3] == "/a2"


def test_a_service_line_is_never_timed_before_it_was_written_nor_long_after(
        tmp_path: Path) -> None:
    apps = tmp_path / "apps"
    sampler = Sampler()
    log = apps / "a.test" / "web.1.log"
    write_at(log, "one\ntwo\n", T0, sampler, apps)
    write_at(log, "three\n", T0 + 1, sampler, apps)
    with log.open("a") as handle:
        handle.write("four\n")  # not sampled yet: the file's mtime
    os.utime(log, (T0 + 2, T0 + 2))
    lines, _ = tail(Source("a.test", "web", 1, log), 10, None)
    assert [(line.text, line.at) for line in lines] == [
        ("one", T0), ("two", T0), ("three", T0 + 1), ("four", T0 + 2)]
    assert Timeline.load(log).sizes == [8, 14]


def test_rotation_starts_a_logs_times_again(tmp_path: Path) -> None:
    apps = tmp_path / "apps"
    sampler = Sampler()
    log = apps / "a.test" / "web.1.log"
    write_at(log, "x" * 50 + "\n", T0, sampler, apps)
    assert times_path(log).exists()
    assert rotate_if_large(log, max_bytes=10)
    assert not times_path(log).exists()
    write_at(log, "after\n", T0 + 9, sampler, apps)
    assert Timeline.load(log).sizes == [6]
    (line,), _ = tail(Source("a.test", "web", 1, log), 10, None)
    assert (line.text, line.at) == ("after", T0 + 9)


def test_a_long_log_is_tailed_from_its_end_without_a_partial_last_line(tmp_path: Path) -> None:
    log = tmp_path / "a.test" / ACCESS_LOG_NAME
    log.parent.mkdir(parents=True)
    partial = access_frame(T0 + 999, "/cut")[:-5]  # a write still under way
    with log.open("wb") as handle:
        for n in range(5000):
            handle.write(access_frame(T0 + n / 10, f"/p{n}"))
        handle.write(partial)
    source = Source("a.test", "router", None, log)
    lines, end = tail(source, 3, None)
    assert [line.text.split(" ")[3] for line in lines] == ["/p4997", "/p4998", "/p4999"]
    assert end == log.stat().st_size - len(partial)
    since, _ = tail(source, 10_000, T0 + 400)
    assert len(since) == 1000 and since[0].text.split(" ")[3] == "/p4000"
