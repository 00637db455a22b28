"""The home's certificate store (keelway/certs.py): a pair is checked before anything is
written, replaced whole, kept private, and listed without its key."""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

import pytest
import trustme

from keelway import certs
from keelway.home import Home


def _pair(ca: trustme.CA, *names: str, **kw: object) -> tuple[bytes, bytes]:
    issued = ca.issue_cert(*names, **kw)  # type: ignore[arg-type]
    return issued.cert_chain_pems[0].bytes(), issued.private_key_pem.bytes()


@pytest.fixture
def home(tmp_path: Path) -> Home:
    made = Home(tmp_path / "home")
    made.ensure()
    return made


def test_a_good_pair_is_laid_down_private_and_listed_without_its_key(home: Home) -> None:
    ca = trustme.CA()
    chain, key = _pair(ca, "a.test", "www.a.test")
    info = certs.check_pair("a.test", chain, key)
    assert info.names == ("a.test", "www.a.test") and info.not_after > info.not_before
    certs.lay_down(home, "a.test", chain, key)
    where = home.certs_dir / "a.test"
    assert (where / "fullchain.pem").read_bytes() == chain
    assert stat.S_IMODE(os.stat(where / "privkey.pem").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    (listed,) = certs.certificates(home)
    assert listed.view().keys() == {"name", "names", "issuer", "not_before", "not_after"}
    assert key.decode() not in repr(listed.view())


def test_a_replacement_is_whole_and_leaves_nothing_of_the_old_one(home: Home) -> None:
    ca = trustme.CA()
    first, second = _pair(ca, "a.test"), _pair(ca, "a.test")
    # A name that begins like this one keeps its own files through the sweep.
    other = _pair(ca, "a.test.example")
    certs.lay_down(home, "a.test.example", *other)
    certs.lay_down(home, "a.test", *first)
    certs.lay_down(home, "a.test", *second)
    assert (home.certs_dir / "a.test" / "fullchain.pem").read_bytes() == second[0]
    assert (home.certs_dir / "a.test" / "privkey.pem").read_bytes() == second[1]
    assert (home.certs_dir / "a.test.example" / "fullchain.pem").read_bytes() == other[0]
    left = sorted(p.name for p in home.certs_dir.iterdir())
    assert len(left) == 4  # two links, the directory each names


@pytest.mark.parametrize("case", ["other-name", "other-key", "expired", "not-pem", "key-pem"])
def test_a_pair_that_cannot_serve_the_name_is_refused_saying_why(case: str) -> None:
    ca = trustme.CA()
    chain, key = _pair(ca, "a.test")
    expected = {"other-name": "does not cover b.test", "other-key": "not this certificate",
                "expired": "expired", "not-pem": "not a PEM certificate",
                "key-pem": "not this certificate"}[case]
    name = "b.test" if case == "other-name" else "a.test"
    if case == "other-key":
        key = _pair(ca, "a.test")[1]
    elif case == "expired":
        long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
        chain, key = _pair(ca, "a.test", not_after=long_ago)
    elif case == "not-pem":
        chain = b"hello"
    elif case == "key-pem":
        key = b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"
    with pytest.raises(certs.CertificateError, match=expected) as raised:
        certs.check_pair(name, chain, key)
    assert key.decode(errors="replace") not in str(raised.value)


def test_a_wildcard_covers_one_label_only() -> None:
    assert certs.covers(("*.a.test",), "www.a.test")
    assert not certs.covers(("*.a.test",), "a.test")
    assert not certs.covers(("*.a.test",), "x.www.a.test")
