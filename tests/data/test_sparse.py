"""The sparse copy: holes and runs of zeros are not written, every byte is hashed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from keelway.data import sparse

MIB = 1024 * 1024


def test_a_sparse_copy_keeps_holes_and_zero_runs_out_of_the_disk_and_hashes_every_byte(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    with open(src, "wb") as handle:
        handle.write(os.urandom(100_000))  # data
        handle.seek(16 * MIB)  # a hole
        handle.write(bytes(4 * MIB))  # written zeros
        handle.write(b"tail")
        handle.truncate(48 * MIB)  # a trailing hole
    dst = tmp_path / "dst"
    src_fd, dst_fd = os.open(src, os.O_RDONLY), os.open(dst, os.O_WRONLY | os.O_CREAT)
    try:
        digest, size = sparse.copy(src_fd, dst_fd)
    finally:
        os.close(src_fd)
        os.close(dst_fd)
    assert size == 48 * MIB == dst.stat().st_size
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    assert digest == want == hashlib.sha256(dst.read_bytes()).hexdigest()
    assert sparse.disk_bytes(dst) < 1 * MIB  # 100 KB of data, and the tail's block
