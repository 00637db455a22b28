"""A file copy that takes no more disk than its data: holes stay holes, and runs of
zeros become holes, as `cp --sparse=always` does.

Why not `shutil.copyfile` or `os.copy_file_range`: on ext4 and tmpfs both read a hole as
zeros and write them out, so a 2.7 GB file holding 2.6 MB of data takes 2.7 GB once
copied. Here the source's data extents are found with SEEK_DATA/SEEK_HOLE, each block
of them that is all zeros is skipped (the destination's size is set at the end, so a
skipped tail reads as zeros too), and the sha256 of every byte, holes included, is
computed on the way: the caller compares it with the one it verified.
"""

from __future__ import annotations

import errno
import hashlib
import os

BLOCK_BYTES = 64 * 1024
_CHUNK_BYTES = 1 << 20
_ZERO_BLOCK = bytes(BLOCK_BYTES)
_ZERO_CHUNK = bytes(_CHUNK_BYTES)


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) of each data extent of `fd`; the whole file where the
    filesystem cannot say."""
    found = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past `offset`: a hole to the end
                break
            if exc.errno == errno.EINVAL:  # SEEK_DATA not supported here
                return [(offset, size)]
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        found.append((start, min(end, size)))
        offset = end
    return found


def _hash_zeros(digest: hashlib._Hash, count: int) -> None:
    while count > 0:
        step = min(count, _CHUNK_BYTES)
        digest.update(_ZERO_CHUNK[:step])
        count -= step


def copy(src_fd: int, dst_fd: int) -> tuple[str, int]:
    """Copy all of `src_fd` into the empty `dst_fd`, writing only blocks that hold a
    non-zero byte; returns (sha256 of the source's bytes, size). `dst_fd` is not
    fsynced: the caller does that before its rename."""
    size = os.fstat(src_fd).st_size
    digest = hashlib.sha256()
    hashed = 0
    for start, end in _extents(src_fd, size):
        _hash_zeros(digest, start - hashed)
        offset = start
        while offset < end:
            chunk = os.pread(src_fd, min(_CHUNK_BYTES, end - offset), offset)
            if not chunk:
                raise OSError(f"the file shrank while it was copied (at {offset})")
            digest.update(chunk)
            if chunk != _ZERO_CHUNK[:len(chunk)]:
                _write_nonzero(dst_fd, chunk, offset)
            offset += len(chunk)
        hashed = end
    _hash_zeros(digest, size - hashed)
    os.ftruncate(dst_fd, size)
    return digest.hexdigest(), size


def _write_nonzero(fd: int, chunk: bytes, offset: int) -> None:
    view = memoryview(chunk)
    for at in range(0, len(chunk), BLOCK_BYTES):
        block = view[at:at + BLOCK_BYTES]
        if block != _ZERO_BLOCK[:len(block)]:
            written = 0
            while written < len(block):
                written += os.pwrite(fd, block[written:], offset + at + written)


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """What `path` takes on disk (its allocated blocks), not its apparent size."""
    return os.stat(path).st_blocks * 512
