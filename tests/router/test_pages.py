"""The router's own pages, one per route state that does not serve: each says what is
true, and only one whose wait is known carries Retry-After. No I/O."""

from __future__ import annotations

import pytest

from keelway.router import responses
from keelway.router.route_table import Handling

PAGES = {
    Handling.STOPPED: (b"The site is stopped.", False),
    Handling.NO_RELEASE: (b"The site is not deployed yet.", False),
    Handling.CRASHED: (b"The site is restarting.", True),
    Handling.GATED: (b"The site is down for maintenance.", True),
    Handling.HOLDING: (b"The site is busy for a moment.", True),
    Handling.PARKED: (b"The site is busy for a moment.", True),
}


@pytest.mark.parametrize("state", list(PAGES))
def test_each_state_that_does_not_serve_has_its_own_true_page(state: Handling) -> None:
    text, retries = PAGES[state]
    page = responses.refusal(state, 42).keep_alive
    assert page.startswith(b"HTTP/1.1 503 ") and text in page
    assert (b"\r\nRetry-After: 42\r\n" in page) is retries


def test_only_a_held_request_is_told_the_site_is_busy() -> None:
    busy = [s for s in Handling if b"busy" in responses.refusal(s, 5).keep_alive]
    assert set(busy) == {Handling.HOLDING, Handling.PARKED, Handling.SERVING,
                         Handling.DRAINING}  # the last two: a request that could not wait
