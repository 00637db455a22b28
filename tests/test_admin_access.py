"""The admin listener's token rule (keelway/admin_access.py), cell by cell."""

from __future__ import annotations

import pytest

from keelway.admin_access import (
    COOKIE,
    TOKEN_ENV,
    Access,
    AdminAccessError,
    decide,
    is_loopback,
    required_token,
)

TOKEN = "s3cret-admin-token-0123456789"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("127.255.255.254", True), ("::1", True),
    ("[::1]", True), ("localhost", True), ("0.0.0.0", False), ("::", False),
    ("10.0.0.5", False), ("192.168.1.2", False), ("example.com", False),
    ("localhost.example.com", False), ("128.0.0.1", False)])
def test_loopback_is_127_0_0_0_8_and_the_ipv6_one_and_nothing_named_otherwise(
        host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_loopback_listener_needs_no_token_but_honours_one_that_is_set() -> None:
    assert required_token("127.0.0.1", {}) is None
    assert required_token("127.0.0.1", {TOKEN_ENV: TOKEN}) == TOKEN


def test_off_loopback_the_listener_refuses_to_start_without_a_token() -> None:
    with pytest.raises(AdminAccessError, match=TOKEN_ENV):
        required_token("0.0.0.0", {})
    with pytest.raises(AdminAccessError, match=TOKEN_ENV):
        required_token("10.1.2.3", {TOKEN_ENV: ""})


def test_a_token_too_short_is_refused_and_never_said() -> None:
    with pytest.raises(AdminAccessError) as refused:
        required_token("0.0.0.0", {TOKEN_ENV: "short"})
    assert "short" not in str(refused.value).replace("shorter", "")
    assert required_token("0.0.0.0", {TOKEN_ENV: TOKEN}) == TOKEN


@pytest.mark.parametrize(("authorization", "cookie", "access"), [
    (None, None, Access.DENIED),
    (f"Bearer {TOKEN}", None, Access.ALLOWED),
    (f"bearer {TOKEN}", None, Access.ALLOWED),
    (f"Bearer {TOKEN}x", None, Access.DENIED),
    (f"Bearer {TOKEN[:-1]}", None, Access.DENIED),
    (f"Basic {TOKEN}", None, Access.DENIED),
    (TOKEN, None, Access.DENIED),
    ("Bearer ", None, Access.DENIED),
    (None, TOKEN, Access.ALLOWED),
    (None, "wrong", Access.DENIED),
    ("Bearer wrong", TOKEN, Access.ALLOWED),
    (f"Bearer {TOKEN}", "wrong", Access.ALLOWED),
    ("Bearer ünïcode", None, Access.DENIED),
])
def test_a_request_is_let_in_only_with_the_token_as_a_bearer_or_in_the_cookie(
        authorization: str | None, cookie: str | None, access: Access) -> None:
    assert decide(TOKEN, authorization, cookie) is access


def test_without_a_required_token_every_request_is_let_in() -> None:
    assert decide(None, None, None) is Access.ALLOWED
    assert decide(None, "Bearer anything", "anything") is Access.ALLOWED
    assert COOKIE == "keelway_admin"
