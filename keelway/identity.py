"""Who a tenant's processes run as: a uid of its own per instance, a group per app.

The rules, all in this module:
- Identities are in force only when keelway runs as root and the home is reachable by
  a uid that is not root (every directory above it searchable by others): a process
  that became a tenant's uid must still find its build and its data dir. Otherwise
  every tenant runs as keelway's own uid, and `in_force` says why (status, doctor).
- Numbers come from a range keelway owns, like systemd's DynamicUser, with no
  /etc/passwd entry: `ID_BASE + n`, where n is allocated once per name by the store and
  never given to another name, so data an instance left behind stays owned by a uid that
  nobody else gets. The range sits above systemd's container range (up to 0x6FFFFFFF)
  and below 2**31, which some tools read as negative.
- An instance runs as its uid, with its app's group as its only group; its data dir,
  database, env file and notify socket are its own (0700/0600). Its app's builds are
  root's, readable by the app's group only; the build command runs as the app's builder
  uid in the same group. The replicator is keelway's own program and runs as root.

Leaf module: no keelway imports (the builds, the runtime and the data paths all use it).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

ID_BASE = 0x7E000000
# A home whose directories tenants must traverse (nothing listable: search bit only).
TRAVERSE_DIR_MODE = 0o711


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int

    @classmethod
    def numbered(cls, uid_n: int, gid_n: int) -> Identity:
        return cls(ID_BASE + uid_n, ID_BASE + gid_n)


def reachable(path: Path) -> bool:
    """Whether a uid that is neither owner nor in the group can search every directory
    from / down to `path` (`path` included when it is a directory)."""
    current = Path(os.path.abspath(path))
    for directory in (current, *current.parents):
        try:
            info = directory.stat()
        except OSError:
            continue  # not made yet: its parent decides
        if stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH:
            return False
    return True


def in_force(home_root: Path) -> str | None:
    """None when each tenant runs as a uid of its own; otherwise why they share one."""
    if os.geteuid() != 0:
        return "keelway does not run as root, so every tenant runs as its uid"
    parent = Path(os.path.abspath(home_root)).parent
    if not reachable(parent):
        blocked = next(d for d in (parent, *parent.parents)
                       if d.is_dir() and not d.stat().st_mode & stat.S_IXOTH)
        return (f"{blocked} is not searchable by other users, so a tenant's uid could not "
                f"reach the home {home_root}; every tenant runs as root (move "
                "KEELWAY_HOME, e.g. to /var/lib/keelway, or `chmod o+x` that directory)")
    return None


def own(path: Path, identity: Identity, mode: int) -> bool:
    """Make `path` the identity's with `mode`, not following a link; False if absent."""
    try:
        os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
        os.chmod(path, mode)
    except FileNotFoundError:
        return False
    return True


def own_tree(root: Path, identity: Identity) -> None:
    """Make everything under `root` the identity's, modes kept, links not followed."""
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(Path(directory) / name, identity.uid, identity.gid,
                     follow_symlinks=False)
    os.chown(root, identity.uid, identity.gid, follow_symlinks=False)


def share_with_group(root: Path, gid: int) -> None:
    """Give a sealed build to root and group `gid`: readable (and, where the owner may
    run or enter, runnable) by the group, nothing for others, writable by nobody."""
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            _share(Path(directory) / name, gid)
    _share(root, gid)


def _share(path: Path, gid: int) -> None:
    info = path.lstat()
    os.chown(path, 0, gid, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return
    owner = stat.S_IMODE(info.st_mode) & 0o500
    os.chmod(path, owner | (owner >> 3))


def open_app_builds(app_dir: Path, gid: int) -> None:
    """builds/<app>/: root's, passable (not listable) by the app's group, on the way to
    its builds and, while one is staged, to the builder's staging tree."""
    own(app_dir, Identity(0, gid), 0o710)


def shared_with(root: Path, gid: int) -> bool:
    """Whether `share_with_group(root, gid)` was done (its root is the last it touches)."""
    try:
        info = root.stat()
    except FileNotFoundError:
        return False
    return info.st_gid == gid and info.st_uid == 0 and bool(info.st_mode & stat.S_IRGRP)


def become(identity: Identity) -> None:
    """Drop to `identity` for good: its group as the only group, then the uid (in that
    order: once the uid is dropped, the groups can no longer be changed). For the child
    of a fork, before it execs."""
    os.setgroups([identity.gid])
    os.setresgid(identity.gid, identity.gid, identity.gid)
    os.setresuid(identity.uid, identity.uid, identity.uid)
