"""Safe extraction of a user's tar archive into a staging directory.

Owns: deciding which archives are safe, and writing them out without ever touching a
path outside `dest`. Every member is checked before the first byte is written (one
pass over the whole archive), so a hostile archive leaves nothing extracted: the caller
removes `dest` and nothing else exists.

Refused, naming the member: absolute paths; any `..` component; a member whose path
goes through a symlink in the archive; a symlink whose target is absolute or resolves
(following the archive's own symlinks) outside the tree, or loops; a hard link to a
member that is not an earlier regular file of the archive; device files, fifos and any
other special type; the same path twice (except directories); a file under a
non-directory; archives over `max_members` or `max_bytes`.

Normalised: `./` prefixes dropped; owners ignored; files become 0600, or 0700 when the
owner could execute them (setuid, setgid, sticky and every group/other bit are never
written: a build may hold secrets of its own, see keelway/home.py); directories 0700.

Left out: what the default ignores and the archive's own root `.keelwayignore` name
(keelway/builds/ignore.py), decided after every member has passed the checks above (a
hostile member is refused even when it would be left out) and before anything is
written, so a left-out file never reaches the disk. A kept hard link to a left-out file
is written as a copy of that file's data.

The single top directory is stripped: when every member lies under one top-level
directory (as in GitHub and `git archive --prefix` tarballs), that directory becomes
the root. An archive whose root holds anything else is extracted as-is.

Second layer: after our own checks, each (renamed) member also passes
`tarfile.data_filter`, and every extracted symlink is re-checked with `realpath`. Our
checks come first so that behaviour and messages are ours, not the stdlib version's.
"""

from __future__ import annotations

import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from keelway.builds.errors import SourceError, UnsafeArchiveError
from keelway.builds.ignore import IGNORE_FILE, MAX_IGNORE_FILE_BYTES, IgnoreRules

MAX_MEMBERS = 200_000
MAX_BYTES = 4 * 1024**3
_MAX_SYMLINK_HOPS = 40
_COPY_CHUNK_BYTES = 1024 * 1024

Parts = tuple[str, ...]
# what reading a corrupt or truncated archive raises, from tarfile and its decompressors
_UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError)


@dataclass(frozen=True, slots=True)
class _Planned:
    member: tarfile.TarInfo
    parts: Parts  # path inside dest, top dir stripped; never empty
    link_parts: Parts  # hard links: the target member's path, stripped
    # a hard link whose target is left out: its data (the target's) is written instead
    link_as_copy: bool = False


def safe_extract_tar(
    archive: Path,
    dest: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_bytes: int = MAX_BYTES,
) -> None:
    """Extract `archive` (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz) into the directory `dest`.

    `dest` must be empty or missing. Raises UnsafeArchiveError (naming the member) before
    writing anything if any member is refused, SourceError if its `.keelwayignore` is
    unreadable; on an OSError mid-write `dest` holds a partial tree that the caller must
    remove.
    """
    dest = Path(dest)
    with _open(archive) as tar:
        try:
            plan = _check(tar, max_members=max_members, max_bytes=max_bytes)
            plan = _leave_out_ignored(tar, plan)
        except _UNREADABLE as exc:
            # nothing is written during the check: any failure here is the archive's
            raise _unreadable(archive, exc) from exc
        dest.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        for item in plan:
            # an OSError here (disk full, permissions) is the box's, not the archive's
            _write(tar, item, dest)
    _recheck_symlinks(dest, plan)


def _open(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, mode="r:*")
    except _UNREADABLE as exc:
        raise _unreadable(archive, exc) from exc


def _unreadable(archive: Path, exc: BaseException) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"{Path(archive).name} is not a readable tar archive: {exc}")


def _leave_out_ignored(tar: tarfile.TarFile, plan: list[_Planned]) -> list[_Planned]:
    """The plan without what the ignore rules leave out (see the module header)."""
    rules = IgnoreRules.from_file(_ignore_file(tar, plan))
    kept: list[_Planned] = []
    kept_files: set[Parts] = set()
    for item in plan:
        member = item.member
        if rules.ignored_below("/".join(item.parts), is_dir=member.isdir()):
            continue
        if member.islnk() and item.link_parts not in kept_files:
            item = _Planned(member, item.parts, item.link_parts, link_as_copy=True)
        if not member.isdir() and not member.issym():
            kept_files.add(item.parts)
        kept.append(item)
    return kept


def _ignore_file(tar: tarfile.TarFile, plan: list[_Planned]) -> bytes | None:
    """The data of the archive's root `.keelwayignore`, or None when it has none."""
    for item in plan:
        if item.parts != (IGNORE_FILE,):
            continue
        member = item.member
        if not (member.isreg() or member.islnk()):
            raise SourceError(f"{IGNORE_FILE} in the archive must be a regular file")
        source = tar.extractfile(member)
        if source is None:  # unreachable for a file or hard link; refuse rather than guess
            raise UnsafeArchiveError(f"archive member {member.name!r} has no data", member.name)
        with source:
            return source.read(MAX_IGNORE_FILE_BYTES + 1)  # IgnoreRules refuses one too big
    return None


def _split(name: str, member: str, *, link: bool = False) -> Parts:
    """A member or hard-link name as path components; refuses absolute paths and `..`."""
    what = f"archive member {member!r}"
    if link:
        what += f" is a hard link to {name!r}, which"
    if name.startswith("/"):
        raise UnsafeArchiveError(f"{what} has an absolute path", member)
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchiveError(f"{what} has a '..' component", member)
    return parts


def _check(tar: tarfile.TarFile, *, max_members: int, max_bytes: int) -> list[_Planned]:
    members: list[tuple[tarfile.TarInfo, Parts]] = []
    total_bytes = 0
    for member in _iter_members(tar):
        if len(members) >= max_members:
            raise UnsafeArchiveError(f"archive has more than {max_members} members")
        parts = _split(member.name, member.name)
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeArchiveError(
                f"archive member {member.name!r} is a {_kind(member)}; only files, "
                "directories and links are allowed",
                member.name,
            )
        total_bytes += member.size if member.isreg() else 0
        if total_bytes > max_bytes:
            raise UnsafeArchiveError(f"archive holds more than {max_bytes} bytes")
        if parts:  # an empty path is the archive root (`./`): nothing to write
            members.append((member, parts))

    strip = _single_top(members)
    top = members[0][1][:strip] if members else ()
    plan: list[_Planned] = []
    kinds: dict[Parts, str] = {}  # path -> "dir" | "file" | "link", as extracted so far
    symlinks: dict[Parts, str] = {
        parts[strip:]: member.linkname for member, parts in members if member.issym()
    }
    for member, full in members:
        parts = full[strip:]
        if not parts:
            continue  # the stripped top directory itself
        name = member.name
        for depth in range(1, len(parts)):
            above = kinds.get(parts[:depth])
            if parts[:depth] in symlinks:
                raise UnsafeArchiveError(
                    f"archive member {name!r} goes through a symlink in the archive", name
                )
            if above not in (None, "dir"):
                raise UnsafeArchiveError(
                    f"archive member {name!r} is under {'/'.join(parts[:depth])!r}, "
                    "which is not a directory",
                    name,
                )
            kinds[parts[:depth]] = "dir"
        earlier = kinds.get(parts)
        if earlier is not None and not (earlier == "dir" and member.isdir()):
            raise UnsafeArchiveError(f"archive member {name!r} appears twice", name)
        link_parts: Parts = ()
        if member.issym():
            _check_symlink(name, parts, member.linkname, symlinks)
        elif member.islnk():
            full_link = _split(member.linkname, name, link=True)
            link_parts = full_link[strip:]
            if full_link[:strip] != top or kinds.get(link_parts) != "file":
                raise UnsafeArchiveError(
                    f"archive member {name!r} is a hard link to {member.linkname!r}, "
                    "which is not an earlier regular file of the archive",
                    name,
                )
        kinds[parts] = "dir" if member.isdir() else "link" if member.issym() else "file"
        _stdlib_filter(member, parts, link_parts)
        plan.append(_Planned(member=member, parts=parts, link_parts=link_parts))
    return plan


def _iter_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    member = tar.next()
    while member is not None:
        yield member
        member = tar.next()


def _single_top(members: list[tuple[tarfile.TarInfo, Parts]]) -> int:
    """1 if every member lies under one top-level directory (strip it), else 0."""
    tops = {parts[0] for _member, parts in members}
    if len(tops) != 1:
        return 0
    for member, parts in members:
        if len(parts) == 1 and not member.isdir():
            return 0  # the one top-level entry is a file or link: keep it
    return 1


def _check_symlink(name: str, parts: Parts, target: str, symlinks: dict[Parts, str]) -> None:
    """Resolve `target` inside the archive's tree, following the archive's own symlinks."""

    def refuse(why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"archive member {name!r} is a symlink {why}", name)

    if not target:
        raise refuse("with an empty target")
    if target.startswith("/"):
        raise refuse(f"to the absolute path {target!r}")
    stack = list(parts[:-1])
    pending = list(reversed(target.split("/")))
    hops = 0
    while pending:
        component = pending.pop()
        if component in ("", "."):
            continue
        if component == "..":
            if not stack:
                raise refuse(f"to {target!r}, outside the archive")
            stack.pop()
            continue
        stack.append(component)
        through = symlinks.get(tuple(stack))
        if through is None:
            continue
        hops += 1
        if hops > _MAX_SYMLINK_HOPS:
            raise refuse(f"to {target!r}, which loops")
        if through.startswith("/"):
            raise refuse(f"to {target!r}, which leads to the absolute path {through!r}")
        stack.pop()
        pending.extend(reversed(through.split("/")))


def _stdlib_filter(member: tarfile.TarInfo, parts: Parts, link_parts: Parts) -> None:
    """Second layer: the stdlib's own data filter on the member as we will write it.

    Run against a dest that does not exist yet, so realpath cannot follow anything on
    disk; it checks names only, which is all our own checks rely on too.
    """
    renamed = member.replace(
        name="/".join(parts),
        linkname="/".join(link_parts) if member.islnk() else member.linkname,
        deep=False,
    )
    try:
        tarfile.data_filter(renamed, "/nonexistent-keelway-dest")
    except tarfile.FilterError as exc:
        raise UnsafeArchiveError(
            f"archive member {member.name!r} is refused: {exc}", member.name
        ) from exc


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "fifo"
    return f"special file (type {member.type!r})"


DIR_MODE = 0o700


def file_mode(mode: int) -> int:
    """The mode keelway gives a file: 0700 if its owner could execute it, else 0600."""
    return 0o700 if mode & stat.S_IXUSR else 0o600


def _write(tar: tarfile.TarFile, item: _Planned, dest: Path) -> None:
    member = item.member
    target = dest.joinpath(*item.parts)
    _mkdirs(dest, item.parts[:-1])
    if member.isdir():
        if not target.is_dir():
            target.mkdir(mode=DIR_MODE)
    elif member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk() and not item.link_as_copy:
        os.link(dest.joinpath(*item.link_parts), target, follow_symlinks=False)
    else:
        source = tar.extractfile(member)  # a hard link's: its target's data
        if source is None:  # unreachable for a regular member; refuse rather than guess
            raise UnsafeArchiveError(f"archive member {member.name!r} has no data", member.name)
        mode = file_mode(member.mode)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(target, flags, mode)
        # Only a umask that masks the owner's own bits changes it, but the owner's x bit
        # is part of the digest; group and other stay clear either way.
        os.fchmod(fd, mode)
        with source, os.fdopen(fd, "wb") as out:
            while chunk := source.read(_COPY_CHUNK_BYTES):
                out.write(chunk)


def _mkdirs(dest: Path, parts: Parts) -> None:
    """The directories above a member that the archive did not list, each 0700."""
    here = dest
    for part in parts:
        here = here / part
        if not here.is_dir():
            here.mkdir(mode=DIR_MODE)


def _recheck_symlinks(dest: Path, plan: list[_Planned]) -> None:
    """Second layer: every extracted symlink must resolve inside `dest` on disk too."""
    root = os.path.realpath(dest)
    for item in plan:
        if item.member.issym():
            resolved = os.path.realpath(dest.joinpath(*item.parts))
            if os.path.commonpath([root, resolved]) != root:
                name = item.member.name
                raise UnsafeArchiveError(
                    f"archive member {name!r} is a symlink that resolves outside the tree",
                    name,
                )
