"""The real S3 server of tests/s3server.py, for the object-store contract suite."""

from tests.s3server import s3_env, s3_server

__all__ = ["s3_env", "s3_server"]
