"""Safe extraction: hostile archives are refused naming the member and leave nothing."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from keelway.builds.errors import SourceError, UnsafeArchiveError
from keelway.builds.extract import safe_extract_tar
from keelway.builds.stage import stage

PROCFILE = b"web: python -m http.server $PORT\n"


@dataclass(frozen=True)
class Entry:
    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644


WRITE_MODE: dict[str, Literal["w", "w:gz", "w:bz2", "w:xz"]] = {
    "": "w",
    "gz": "w:gz",
    "bz2": "w:bz2",
    "xz": "w:xz",
}


def write_tar(path: Path, entries: list[Entry], compression: str = "") -> Path:
    with tarfile.open(path, WRITE_MODE[compression]) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.kind
            info.mode = entry.mode
            info.linkname = entry.linkname
            if entry.kind == tarfile.REGTYPE:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                tar.addfile(info)
    return path


def good(prefix: str = "") -> list[Entry]:
    return [Entry(f"{prefix}Procfile", data=PROCFILE)]


def assert_nothing_left(builds_dir: Path) -> None:
    app_dir = builds_dir / "demo"
    leftovers = sorted(p.name for p in app_dir.iterdir()) if app_dir.exists() else []
    assert leftovers == []


HOSTILE = {
    "absolute path": [*good(), Entry("/etc/evil", data=b"x")],
    "dotdot component": [*good(), Entry("sub/../../evil", data=b"x")],
    "dotdot at the top": [*good(), Entry("../evil", data=b"x")],
    "absolute symlink": [*good(), Entry("evil", tarfile.SYMTYPE, linkname="/etc/passwd")],
    "relative symlink out of the tree": [
        *good(),
        Entry("sub/evil", tarfile.SYMTYPE, linkname="../../outside"),
    ],
    "symlink escaping through another symlink": [
        *good(),
        Entry("sub/", tarfile.DIRTYPE, mode=0o755),
        Entry("sub/up", tarfile.SYMTYPE, linkname=".."),
        Entry("evil", tarfile.SYMTYPE, linkname="sub/up/.."),
    ],
    "symlink with an empty target": [*good(), Entry("evil", tarfile.SYMTYPE, linkname="")],
    "file under a file": [*good(), Entry("a", data=b"x"), Entry("a/evil", data=b"y")],
    "symlink loop": [*good(), Entry("evil", tarfile.SYMTYPE, linkname="evil/x")],
    "hard link out of the tree": [*good(), Entry("evil", tarfile.LNKTYPE, linkname="../x")],
    "hard link to an absolute path": [
        *good(),
        Entry("evil", tarfile.LNKTYPE, linkname="/etc/passwd"),
    ],
    "hard link to a missing member": [*good(), Entry("evil", tarfile.LNKTYPE, linkname="nope")],
    "character device": [*good(), Entry("evil", tarfile.CHRTYPE)],
    "block device": [*good(), Entry("evil", tarfile.BLKTYPE)],
    "fifo": [*good(), Entry("evil", tarfile.FIFOTYPE)],
    "member written through a symlink": [
        *good(),
        Entry("evil", tarfile.SYMTYPE, linkname="sub"),
        Entry("sub/", tarfile.DIRTYPE, mode=0o755),
        Entry("evil/payload", data=b"x"),
    ],
    "the same file twice": [*good(), Entry("evil", data=b"a"), Entry("evil", data=b"b")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_tarball_is_refused_naming_the_member_and_leaves_nothing(
    tmp_path: Path, builds_dir: Path, case: str
) -> None:
    archive = write_tar(tmp_path / "hostile.tar", HOSTILE[case])
    with pytest.raises(UnsafeArchiveError) as caught:
        stage(archive, builds_dir=builds_dir, app="demo")
    offending = HOSTILE[case][-1].name
    assert caught.value.member == offending
    assert repr(offending) in str(caught.value)
    assert_nothing_left(builds_dir)
    assert not (tmp_path / "outside").exists()
    assert not (tmp_path / "evil").exists()


def test_hostile_member_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    entries = [*good(), Entry("a.txt", data=b"a"), Entry("/etc/evil", data=b"x")]
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match="absolute path"):
        safe_extract_tar(write_tar(tmp_path / "x.tar", entries), dest)
    assert not dest.exists()


def test_a_single_top_directory_is_stripped_like_a_github_tarball(
    tmp_path: Path, builds_dir: Path
) -> None:
    entries = [
        Entry("blog-main/", tarfile.DIRTYPE, mode=0o755),
        *good("blog-main/"),
        Entry("blog-main/bin/run", data=b"#!/bin/sh\n", mode=0o755),
        Entry("blog-main/static/", tarfile.DIRTYPE, mode=0o755),
        Entry("blog-main/static/site.css", data=b"body{}"),
        Entry("blog-main/current.css", tarfile.SYMTYPE, linkname="static/site.css"),
        Entry("blog-main/copy.css", tarfile.LNKTYPE, linkname="blog-main/static/site.css"),
    ]
    build = stage(
        write_tar(tmp_path / "blog.tar.gz", entries, "gz"), builds_dir=builds_dir, app="demo"
    )
    assert (build.path / "Procfile").read_bytes() == PROCFILE
    assert (build.path / "current.css").read_text() == "body{}"
    assert os.readlink(build.path / "current.css") == "static/site.css"
    assert (build.path / "copy.css").read_text() == "body{}"
    assert os.stat(build.path / "bin/run").st_mode & stat.S_IXUSR
    assert not (build.path / "blog-main").exists()


def test_an_archive_with_several_top_level_entries_is_extracted_as_is(tmp_path: Path) -> None:
    entries = [
        *good("./"),
        Entry("./lib/", tarfile.DIRTYPE, mode=0o755),
        Entry("./lib/x.py", data=b"x = 1\n"),
    ]
    dest = tmp_path / "dest"
    safe_extract_tar(write_tar(tmp_path / "x.tar", entries), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["Procfile", "lib"]
    assert (dest / "lib/x.py").read_text() == "x = 1\n"


def test_a_lone_top_level_file_is_not_stripped(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    safe_extract_tar(write_tar(tmp_path / "x.tar", good()), dest)
    assert (dest / "Procfile").read_bytes() == PROCFILE


def test_setuid_setgid_sticky_and_every_group_and_other_bit_are_stripped(
    tmp_path: Path,
) -> None:
    entries = [
        *good(),
        Entry("suid", data=b"x", mode=0o6777),
        Entry("plain", data=b"x", mode=0o1666),
        Entry("dir/", tarfile.DIRTYPE, mode=0o7777),
    ]
    dest = tmp_path / "dest"
    safe_extract_tar(write_tar(tmp_path / "x.tar", entries), dest)
    assert stat.S_IMODE(os.stat(dest / "suid").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(dest / "plain").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(dest / "dir").st_mode) == 0o700


@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
def test_every_supported_compression_stages_to_the_same_digest(
    tmp_path: Path, builds_dir: Path, compression: str
) -> None:
    archive = write_tar(tmp_path / f"app.tar.{compression or 'plain'}", good(), compression)
    plain = write_tar(tmp_path / "reference.tar", good())
    assert (
        stage(archive, builds_dir=builds_dir, app="demo").digest
        == stage(plain, builds_dir=builds_dir, app="demo").digest
    )


def test_a_truncated_archive_is_refused_as_unreadable(tmp_path: Path, builds_dir: Path) -> None:
    archive = write_tar(
        tmp_path / "app.tar.gz", [*good(), Entry("big", data=os.urandom(65536))], "gz"
    )
    archive.write_bytes(archive.read_bytes()[:-30000])
    with pytest.raises(UnsafeArchiveError, match="not a readable tar archive"):
        stage(archive, builds_dir=builds_dir, app="demo")
    assert_nothing_left(builds_dir)


def test_a_plain_file_that_is_not_a_tarball_is_refused(tmp_path: Path, builds_dir: Path) -> None:
    source = tmp_path / "app.zip"
    source.write_bytes(b"PK\x03\x04 not a tar")
    with pytest.raises(SourceError, match="not a directory, a git repository or a tar archive"):
        stage(source, builds_dir=builds_dir, app="demo")
    assert_nothing_left(builds_dir)


def test_archives_over_the_byte_limit_are_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "x.tar", [*good(), Entry("big", data=b"x" * 4096)])
    with pytest.raises(UnsafeArchiveError, match="more than 1000 bytes"):
        safe_extract_tar(archive, tmp_path / "dest", max_bytes=1000)
