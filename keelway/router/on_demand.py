"""Certificates on demand (`--on-demand`): a handshake naming a host the route table
serves, for which the store holds no certificate yet, waits while the router asks the
control plane for one.

The request is `POST /v1/certs/NAME/demand` with body `{}`, raw HTTP/1.1 on the
control plane's API socket (`--wake-socket`, keelway/router/api_socket.py), bounded by
ON_DEMAND_WAIT_S. Its answer:

- 2xx: a certificate for NAME is in the store now; the waiting handshakes go on with it
  (one that still finds none is refused);
- anything else, or no answer within the bound: the waiting handshakes are refused, and
  so is every handshake for NAME for FAILED_HOLDOFF_S after, at once, without asking.

Rules it keeps:
- A name the table does not serve never causes a request: an arbitrary SNI must never
  make the control plane order a certificate (`served` is asked first, every time).
- At most one request per name at a time in this process, however many handshakes wait
  for it: they all wait on the same future. Each worker asks for itself; the control
  plane's demand must therefore be idempotent (a name already being ordered is waited
  for, not ordered twice).
- After a failure the name is not asked again before the hold-off ends, so a client
  retrying in a loop costs the control plane one request per FAILED_HOLDOFF_S.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from keelway.router.api_socket import NO_ANSWER, post

log: Final = logging.getLogger("keelway.router.on_demand")

ON_DEMAND_WAIT_S: Final = 20.0
FAILED_HOLDOFF_S: Final = 30.0

Post = Callable[[Path, str, float], Awaitable[tuple[int, int | None]]]


def demand_path(name: str) -> str:
    """The API path asking for `name`'s certificate (a host: it needs no escaping)."""
    return f"/v1/certs/{name}/demand"


class OnDemand:
    """This process's requests for certificates of served names that have none.

    `served(name)` says whether the route table has the name now. `clock` is monotonic
    (a test's own makes the hold-off instant to cross); `post` is the call to the
    control plane (api_socket.post)."""

    def __init__(self, socket_path: Path, served: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic, post: Post = post) -> None:
        self._socket_path = socket_path
        self._served = served
        self._clock = clock
        self._post = post
        self._loop = asyncio.get_running_loop()
        self._asking: dict[str, asyncio.Future[bool]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # A name whose request failed is not asked again before this.
        self._failed_until: dict[str, float] = {}
        self.requests = 0  # requests sent since start (tests, logs)

    def ask(self, name: str) -> asyncio.Future[bool] | None:
        """The answer to come for `name`'s certificate: True once the control plane says
        the store has one. None: refuse now (the table does not serve the name, or its
        last request failed less than FAILED_HOLDOFF_S ago)."""
        if not self._served(name):
            return None
        asking = self._asking.get(name)
        if asking is not None:
            return asking
        until = self._failed_until.get(name)
        if until is not None:
            if self._clock() < until:
                return None
            del self._failed_until[name]
        answer: asyncio.Future[bool] = self._loop.create_future()
        self._asking[name] = answer
        task = self._loop.create_task(self._request(name, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return answer

    def close(self) -> None:
        """Stop asking: every handshake still waiting is refused."""
        for task in self._tasks:
            task.cancel()
        for answer in self._asking.values():
            if not answer.done():
                answer.set_result(False)
        self._asking.clear()

    async def _request(self, name: str, answer: asyncio.Future[bool]) -> None:
        status = NO_ANSWER
        try:
            self.requests += 1
            status, _ = await self._post(self._socket_path, demand_path(name),
                                         ON_DEMAND_WAIT_S)
        finally:
            got = 200 <= status < 300
            if self._asking.get(name) is answer:
                del self._asking[name]
            if not got:
                # Before the answer is given: a handshake woken by it finds the hold-off.
                self._failed_until[name] = self._clock() + FAILED_HOLDOFF_S
                log.warning("no certificate on demand for %s (HTTP %d); handshakes for it "
                            "are refused for %.0f s", name, status, FAILED_HOLDOFF_S)
            else:
                log.info("certificate on demand for %s: the control plane has it", name)
            if not answer.done():
                answer.set_result(got)
