"""The dependency cache: installed dependencies (a venv, a node_modules) kept by what
determines them, and shared with every build whose key matches by hard links.

Owns the layout of the cache directory (`$KEELWAY_HOME/cache/deps`, or
`$KEELWAY_BUILD_CACHE` when set, which tests use to share one cache between homes):

    <key>/tree/...           the installed tree, every file read-only
    <key>/entry.json         what it is and the absolute path its files were made at
    .tmp-<key>~<writer>      an entry being written, or a crash's leftover

Invariants:
- A key is a digest of everything that determines the installed files: the lockfile or
  requirements bytes, the interpreter (version, ABI, platform, libc), the installer, the
  app and the group its tenants read with. The app is in it because an app's build
  runs the app's own code (its pip configuration, its install scripts), which could
  alter what it installs: one app's entry is never another app's.
- An entry exists under its key only whole: it is written under a temp name from
  `durable.temp_path`, flushed, then renamed, then the directory flushed. A crash at any
  point before the rename leaves a temp whose writer is dead, which `sweep` removes
  and no lookup ever reads; after it, the entry is complete.
- Sharing is by hard link, so a build stays self-contained (removing an entry never
  breaks a build, and gc of builds needs no knowledge of the cache) and costs one link
  per file, not a copy. The shared inodes are the build's too: they are made root's
  (when keelway is root) and the app's group's, with no write bit, before any later
  step of the build runs, so neither the builder uid nor a tenant can change them.
- Directories are never shared: each build has its own, so a build step may still add
  files beside the cached ones.
- A cache on another filesystem than the builds cannot be linked: it is not used (the
  build installs as if there were no cache) rather than copied.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from keelway import failpoints
from keelway.builds.tree import fsync_tree, remove_tree
from keelway.durable import TEMP_PREFIX, fsync_dir, temp_orphaned, temp_path

CACHE_ENV = "KEELWAY_BUILD_CACHE"
ENTRY_META = "entry.json"
TREE = "tree"
_KEY_DOMAIN = b"keelway-deps-v1\0"
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH

failpoints.declare("cache.publish.before", "cache.publish.after")


class CacheUnusable(Exception):
    """The cache cannot be linked from here (another filesystem); build without it."""


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    path: Path
    origin: str  # the absolute path the tree was installed at

    @property
    def tree(self) -> Path:
        return self.path / TREE


def for_home(home_root: Path) -> DepsCache | None:
    """The cache of the home at `home_root`: `$KEELWAY_BUILD_CACHE` when set (`off`: no
    cache, every build installs everything), else `cache/deps` in the home."""
    override = os.environ.get(CACHE_ENV)
    if override == "off":
        return None
    return DepsCache(Path(override) if override else Path(home_root) / "cache" / "deps")


def key_of(parts: Mapping[str, str]) -> str:
    """The key of an installed tree: a digest over every part that determines it."""
    encoded = json.dumps(dict(sorted(parts.items())), separators=(",", ":")).encode()
    return hashlib.sha256(_KEY_DOMAIN + encoded).hexdigest()


class DepsCache:
    """One cache directory; every method is safe while other processes use it too."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def lookup(self, key: str) -> Entry | None:
        """The complete entry named `key`, or None."""
        path = self.root / key
        try:
            meta = json.loads((path / ENTRY_META).read_text())
        except (OSError, ValueError):
            return None
        return Entry(key, path, str(meta.get("origin", "")))

    def link_into(self, entry: Entry, dest: Path) -> int:
        """Lay `entry`'s tree down at `dest` (which must not exist): directories made
        anew, files hard-linked, symlinks copied. Returns the number of files linked.
        Raises CacheUnusable (with `dest` removed) when links cannot cross to `dest` or
        a gc removed the entry meanwhile."""
        try:
            linked = _link_tree(entry.tree, dest)
        except OSError as exc:
            remove_tree(dest)
            if exc.errno == errno.EXDEV:
                raise CacheUnusable(f"the cache {self.root} is on another filesystem "
                                    "than the builds") from exc
            if exc.errno == errno.ENOENT and not entry.tree.is_dir():
                raise CacheUnusable(f"entry {entry.key[:12]} was removed meanwhile") from exc
            raise
        return linked

    def publish(self, key: str, tree: Path, *, what: str, owner_gid: int | None) -> bool:
        """Keep `tree` (an installed venv or node_modules inside a build being staged) as
        the entry `key`. Its files become read-only and, with `owner_gid`, root's and that
        group's: the build shares the same inodes. False when an entry of that key
        already exists (another build published it first); CacheUnusable, with nothing
        left behind, when links cannot cross from the build to the cache."""
        if self.lookup(key) is not None:
            return False
        self.root.parent.mkdir(mode=0o700, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        tmp = temp_path(self.root / key)
        try:
            tmp.mkdir(mode=0o700)
            _link_tree(tree, tmp / TREE, before_link=lambda f: _freeze(f, owner_gid))
            (tmp / ENTRY_META).write_text(json.dumps({"origin": str(tree), "what": what}))
            fsync_tree(tmp)
            failpoints.hit("cache.publish.before")
            try:
                os.rename(tmp, self.root / key)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                remove_tree(tmp)  # another build of the same key published it first
                return False
            fsync_dir(self.root)
            failpoints.hit("cache.publish.after")
        except OSError as exc:
            remove_tree(tmp)
            if exc.errno == errno.EXDEV:
                raise CacheUnusable(f"the cache {self.root} is on another filesystem "
                                    "than the builds") from exc
            raise
        return True

    def _entries(self) -> list[Path]:
        """What the cache directory holds, in name order (none while it does not exist)."""
        try:
            return sorted(self.root.iterdir())
        except FileNotFoundError:
            return []

    def sweep(self) -> list[Path]:
        """Remove entries left half-written by a writer that is gone (a crash's
        leftovers); an entry being written by a live process is left alone."""
        removed: list[Path] = []
        for entry in self._entries():
            if entry.name.startswith(TEMP_PREFIX) and temp_orphaned(entry.name):
                remove_tree(entry)
                removed.append(entry)
        if removed:
            fsync_dir(self.root)
        return removed

    def unused(self) -> list[Path]:
        """Entries no staged build shares a file with (every file has one link): what a
        gc may remove, since a later build of that key installs it again."""
        found: list[Path] = []
        for entry in self._entries():
            if entry.name.startswith(TEMP_PREFIX) or not (entry / ENTRY_META).is_file():
                continue
            if not any(_linked(Path(d) / f) for d, _ds, fs in os.walk(entry / TREE)
                       for f in fs):
                found.append(entry)
        return found

    def remove(self, entry: Path) -> int:
        """Remove one entry (renamed to a temp first, so a crash never leaves it half
        removed under its key); returns the bytes freed."""
        freed = unshared_bytes(entry)
        parked = temp_path(entry)
        os.rename(entry, parked)
        fsync_dir(self.root)
        remove_tree(parked)
        return freed


def _linked(path: Path) -> bool:
    info = path.lstat()
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def _link_tree(source: Path, dest: Path,
               before_link: Callable[[str], None] | None = None) -> int:
    """`source`'s tree laid down at `dest` (which must not exist): directories made anew
    (0700), files hard-linked (`before_link` called on each source file first), symlinks
    copied as symlinks, never followed. Returns the number of files linked. One walk for
    a publish (build -> entry) and a hit (entry -> build), so both share inodes alike."""
    linked = 0
    source_root = str(source)
    for directory, dirs, files in os.walk(source_root):
        target_dir = os.path.normpath(
            os.path.join(dest, os.path.relpath(directory, source_root)))
        os.mkdir(target_dir, 0o700)
        for name in (*dirs, *files):
            path = os.path.join(directory, name)
            target = os.path.join(target_dir, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), target)
                if name in dirs:
                    dirs.remove(name)  # os.walk does not follow it anyway
            elif name in files:
                if before_link is not None:
                    before_link(path)
                os.link(path, target, follow_symlinks=False)
                linked += 1
    return linked


def _freeze(path: str, owner_gid: int | None) -> None:
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode) & ~_WRITE_BITS
    if owner_gid is not None:
        os.chown(path, 0, owner_gid, follow_symlinks=False)
        owner = mode & 0o500
        mode = owner | (owner >> 3)  # as identity.share_with_group leaves a build
    os.chmod(path, mode)


def unshared_bytes(root: Path) -> int:
    """The bytes removing `root` frees: its files that no other directory links to."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            info = (Path(directory) / name).lstat()
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                total += info.st_blocks * 512
    return total


def disk_bytes(root: Path) -> int:
    """What `du` would say of `root`, links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            info = (Path(directory) / name).lstat()
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


__all__ = ["CACHE_ENV", "CacheUnusable", "DepsCache", "Entry", "disk_bytes",
           "for_home", "key_of", "unshared_bytes"]
