"""The router process: wiring of listener, proxy, control server and table file.

Owns the process lifecycle. Start: raise the open-files limit to its hard limit (each
client connection costs a descriptor, each proxied one two), sweep and load the saved
table (a bad file is logged and replaced by an empty table, so health checks and pushes
still work), take the listening socket (inherited fd or own bind), serve. SIGTERM or
SIGINT: stop accepting, let in-flight exchanges finish up to `drain_timeout_s`, exit 0.
Signal handlers only set an event; all work happens in the serving coroutine.

With `--workers N` above 1, `serve` runs once per worker process over the same
inherited listening fd, and the main process accepts nothing itself: it keeps the
control socket, the waker, the hold slots and the leases of the concurrency bounds
(keelway/router/workers.py says why).

HTTPS (`--https-listen` or `--https-fd`, with `--certs`): each process that accepts
reads every connection's ClientHello before its handshake (router/handshakes.py) and
hands it to TLS with the context of the name it asks for (router/tls.py), or refuses
it. With `--on-demand` (and `--wake-socket`), a handshake for a served host with no
certificate yet waits while the control plane gets one (router/on_demand.py); every
worker is passed both and asks for itself, at most once at a time per name.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import uvloop

from keelway.router.access_log import AccessLog
from keelway.router.client import RouterControlError, retire_over, take_listener
from keelway.router.control import ControlServer
from keelway.router.handshakes import Handshakes
from keelway.router.hold_slots import HoldSlots
from keelway.router.leases import Leases
from keelway.router.listen import LISTEN_BACKLOG, bind_tcp
from keelway.router.on_demand import OnDemand
from keelway.router.proxy import Proxy, ProxyOptions
from keelway.router.route_table import EMPTY_TABLE, Handling, RouteTable
from keelway.router.table_file import TableFileError, load_table
from keelway.router.tickets import LOOK_EVERY_S, TicketKeys
from keelway.router.tls import CHALLENGES, Certificates
from keelway.router.waker import Waker
from keelway.router.workers import SlotChannel, WorkerLaunch, WorkerSet, serve_channel

log: Final = logging.getLogger("keelway.router")


class RouterStartError(Exception):
    """The router cannot start with the options it was given (operator's to fix)."""


@dataclass(frozen=True)
class RouterConfig:
    """Everything `serve` needs; `listen_fd` wins over `listen` (exactly one is set)."""

    listen_fd: int | None = None
    listen: tuple[str, int] | None = None
    takeover: Path | None = None
    workers: int = 1
    channel_fd: int | None = None  # set in a worker: its channel to the parent router
    wake_fd: int | None = None  # set in a worker: its notes of parked hosts to wake
    # The control plane's API socket, where parked hosts are asked awake (waker.py);
    # without it a parked route only holds, like `holding`.
    wake_socket: Path | None = None
    control_path: Path | None = None
    state_path: Path | None = None
    options: ProxyOptions = field(default_factory=ProxyOptions)
    # HTTPS: its listening socket (inherited, or bound here; a takeover hands it over
    # beside the HTTP one) and the certificate store it serves from (keelway/router/tls.py).
    https_fd: int | None = None
    https_listen: tuple[str, int] | None = None
    certs: Path | None = None
    # A handshake for a served host with no certificate yet waits while the control
    # plane (on `wake_socket`) gets one (router/on_demand.py); off: it is refused.
    on_demand: bool = False
    # Where each process that accepts writes its access log, a file per instance
    # (router/access_log.py); None: no access log.
    access_log: Path | None = None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_args(argv: Sequence[str]) -> RouterConfig:
    parser = argparse.ArgumentParser(
        prog="python -m keelway.router", description="keelway's HTTP router (data plane)"
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen-fd", type=int, metavar="N", help="inherited listening socket")
    where.add_argument("--listen", type=_host_port, metavar="HOST:PORT", help="bind here")
    where.add_argument("--takeover", type=Path, metavar="PATH",
                       help="take the listening socket from the router on this control "
                            "socket, then retire it (a gapless restart)")
    parser.add_argument("--https-fd", type=int, metavar="N",
                        help="inherited listening socket for HTTPS")
    parser.add_argument("--https-listen", type=_host_port, metavar="HOST:PORT",
                        help="bind here for HTTPS")
    parser.add_argument("--certs", type=Path, metavar="DIR",
                        help="the certificate store HTTPS serves from (DIR/NAME/"
                             "fullchain.pem and privkey.pem)")
    parser.add_argument("--on-demand", action="store_true",
                        help="a handshake for a served host with no certificate yet waits "
                             "while the control plane gets one: POST /v1/certs/"
                             "HOST/demand on --wake-socket (needs both)")
    parser.add_argument("--control", type=Path, metavar="PATH", help="control unix socket")
    parser.add_argument("--access-log", type=Path, metavar="DIR",
                        help="write a line per answered request to DIR/INSTANCE/"
                             "router.access.log (default: no access log)")
    parser.add_argument("--channel-fd", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--wake-fd", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--wake-socket", type=Path, metavar="PATH",
                        help="the control plane's API unix socket: parked hosts are woken "
                             "by POST /v1/instances/HOST/wake there")
    parser.add_argument("--trusted-proxy", action="append", default=[], metavar="IP",
                        help="a front proxy whose X-Forwarded-* are kept (repeatable)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="processes accepting on the listening socket (default 1); "
                             "above 1 they are workers, and this main process accepts none")
    parser.add_argument("--state", type=Path, metavar="PATH", help="route table file")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=ProxyOptions.drain_timeout_s,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight requests may take (default %(default)s)",
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=ProxyOptions.hold_timeout_s,
        metavar="SECONDS",
        help="how long a request to a holding or parked route waits for the table that "
             "serves it before 503 (default %(default)s)",
    )
    parser.add_argument("--max-held", type=int, default=ProxyOptions.max_held, metavar="N",
                        help="requests held at once in all (default %(default)s)")
    parser.add_argument("--max-held-per-host", type=int,
                        default=ProxyOptions.max_held_per_host, metavar="N",
                        help="requests held at once for one host, across the workers "
                             "(default %(default)s)")
    parser.add_argument("--max-concurrency", type=int, default=ProxyOptions.max_concurrency,
                        metavar="N",
                        help="requests in flight at once to one instance, across the "
                             "workers, when its routes name no max_concurrency; past it "
                             "503 (default %(default)s)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.max_held < 1 or args.max_held_per_host < 1:
        parser.error("--max-held and --max-held-per-host must be at least 1")
    if args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    if args.workers > 1 and args.state is None:
        parser.error("--workers above 1 needs --state: workers read the table from it")
    if (args.https_fd is not None or args.https_listen is not None) and args.certs is None:
        parser.error("HTTPS needs --certs: the certificates it serves")
    if args.on_demand and (args.wake_socket is None or args.certs is None):
        parser.error("--on-demand needs --wake-socket (whom to ask) and --certs")
    return RouterConfig(
        workers=args.workers,
        channel_fd=args.channel_fd,
        wake_fd=args.wake_fd,
        wake_socket=args.wake_socket,
        listen_fd=args.listen_fd,
        listen=args.listen,
        https_fd=args.https_fd,
        https_listen=args.https_listen,
        certs=args.certs,
        on_demand=args.on_demand,
        access_log=args.access_log,
        takeover=args.takeover,
        control_path=args.control,
        state_path=args.state,
        options=ProxyOptions(drain_timeout_s=args.drain_timeout,
                             hold_timeout_s=args.hold_timeout,
                             max_held=args.max_held,
                             max_held_per_host=args.max_held_per_host,
                             max_concurrency=args.max_concurrency,
                             trusted_proxies=frozenset(args.trusted_proxy)),
    )


def open_listener(config: RouterConfig) -> socket.socket:
    """The listening TCP socket, inherited or bound here. Raises RouterStartError."""
    sock = _listener(config.listen_fd, config.listen, "--listen")
    if sock is None:
        raise RouterStartError("give --listen-fd or --listen")
    return sock


def open_https_listener(config: RouterConfig) -> socket.socket | None:
    """The HTTPS listening socket, inherited or bound here; None without HTTPS."""
    return _listener(config.https_fd, config.https_listen, "--https-listen")


def _listener(fd: int | None, listen: tuple[str, int] | None,
              flag: str) -> socket.socket | None:
    if fd is not None:
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise RouterStartError(f"{flag}-fd {fd} is not a socket") from exc
        if sock.type != socket.SOCK_STREAM:
            raise RouterStartError(f"{flag}-fd {fd} is not a TCP socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.listen(LISTEN_BACKLOG)
    elif listen is not None:
        host, port = listen
        try:
            sock = bind_tcp(host, port)
        except OSError as exc:
            raise RouterStartError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    else:
        return None
    sock.setblocking(False)
    return sock


def initial_table(state_path: Path | None) -> RouteTable:
    if state_path is None:
        return EMPTY_TABLE
    try:
        table = load_table(state_path)
    except TableFileError as exc:
        log.error("%s; starting with no routes until the control plane pushes a table", exc)
        return EMPTY_TABLE
    if table is None:
        log.info("no saved route table at %s; starting with no routes", state_path)
        return EMPTY_TABLE
    log.info(
        "route table v%d loaded from %s (%d routes)", table.version, state_path, len(table.routes)
    )
    return table


async def serve(config: RouterConfig, sock: socket.socket,
                predecessor: socket.socket | None = None,
                https_sock: socket.socket | None = None) -> bool:
    """Serve until SIGTERM/SIGINT (or a successor retires us), then drain.

    With `predecessor` (a handoff connection), the old router is retired only once this
    one accepts on the shared socket and owns the control path: no gap on either.
    Returns True on a clean drain.
    """
    loop = asyncio.get_running_loop()
    proxy = Proxy(initial_table(config.state_path), config.options)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # With workers, every client connection is theirs (none held here can die with us).
    accepts = config.channel_fd is not None or config.workers == 1
    if accepts and config.access_log is not None:
        # Before the first connection, which reads it once; drain closes it.
        proxy.access_log = AccessLog(config.access_log)
        proxy.access_log.start()
    server = (await loop.create_server(proxy.protocol, sock=sock, backlog=LISTEN_BACKLOG)
              if accepts else None)
    https: Handshakes | None = None
    tickets: TicketKeys | None = None
    if config.certs is not None:
        proxy.challenges = config.certs / CHALLENGES
    if accepts and https_sock is not None:
        assert config.certs is not None  # parse_args insists
        proxy.https_port = https_sock.getsockname()[1]
        # A handshake names a host the table serves now, or it fails (router/tls.py).
        def served(name: str) -> bool:
            return name in proxy.routing.table.routes

        certificates = Certificates(config.certs, served)
        # One session ticket key for every process of the router (router/tickets.py):
        # written by the one that owns the control socket.
        tickets = TicketKeys(config.certs, certificates.take_ticket_keys,
                             writer=config.channel_fd is None)
        tickets.look()
        on_demand = None
        if config.on_demand and config.wake_socket is not None:
            on_demand = OnDemand(config.wake_socket, served)
        https = Handshakes(https_sock, proxy.protocol, certificates, on_demand)
        https.start()
    elif https_sock is not None and config.certs is not None:
        # The main process of workers: it serves no client, and keeps the key they read.
        tickets = TicketKeys(config.certs, None, writer=True)
        tickets.look()
    looking = (loop.create_task(_look_forever(tickets)) if tickets is not None else None)
    if config.channel_fd is not None:
        assert server is not None
        # A worker: its parent is its control plane.
        if config.wake_fd is not None:
            _, slot_channel = await loop.create_unix_connection(
                lambda: SlotChannel(proxy), sock=socket.socket(fileno=config.wake_fd))
            proxy.wake_hook = slot_channel.note_wake
            proxy.slot_hook = slot_channel.slot
            proxy.concurrency.lend_from(slot_channel)
        channel = loop.create_task(
            serve_channel(config.channel_fd, proxy, config.state_path, stop))
        await stop.wait()
        server.close()
        if https is not None:
            https.close()
        if looking is not None:
            looking.cancel()
        channel.cancel()
        return await proxy.drain()
    trusted = tuple(f"--trusted-proxy={ip}" for ip in sorted(config.options.trusted_proxies))
    # The workers hold by the same bound, which is also how long the waker keeps trying.
    options = config.options
    passed_on = (*trusted, f"--hold-timeout={options.hold_timeout_s}",
                 f"--max-held={options.max_held}",
                 f"--max-held-per-host={options.max_held_per_host}",
                 f"--max-concurrency={options.max_concurrency}",
                 *((f"--certs={config.certs}",) if config.certs is not None else ()),
                 *((f"--access-log={config.access_log}",)
                   if config.access_log is not None else ()),
                 # A worker asks for certificates on demand itself (router/on_demand.py).
                 *(("--on-demand", f"--wake-socket={config.wake_socket}")
                   if config.on_demand else ()))
    waker: Waker | None = None
    workers: WorkerSet | None = None

    async def refuse_in_workers(host: str, state: Handling,
                                retry_after_s: int | None) -> None:
        if workers is not None:
            await workers.refuse(host, state, retry_after_s)

    if config.wake_socket is not None:
        waker = Waker(proxy, config.wake_socket, refuse_in_workers)
    workers = WorkerSet(config.workers if config.workers > 1 else 0, WorkerLaunch(
        sock, config.state_path, options.drain_timeout_s, passed_on,
        waker.need if waker is not None else None,
        HoldSlots(options.max_held, options.max_held_per_host), Leases(),
        https_listener=https_sock))
    await workers.start()
    control: ControlServer | None = None
    if config.control_path is not None:
        control = ControlServer(proxy, config.state_path, listener=sock, on_retire=stop.set,
                                workers=workers, https_listener=https_sock)
        await control.start(config.control_path)
    if predecessor is not None:
        if config.state_path is not None:
            # A push the old router took after we loaded the file is in the file now.
            latest = initial_table(config.state_path)
            if latest.version > proxy.routing.table.version:
                proxy.swap(latest)
        await loop.run_in_executor(None, retire_over, predecessor)
        log.info("took over from the previous router")
    host, port = sock.getsockname()[:2]
    log.info(
        "listening on %s:%d%s", host, port, f" (control {config.control_path})" if control else ""
    )
    await stop.wait()
    log.info("stopping: draining %d client connections", len(proxy.connections))
    if server is not None:
        server.close()
    if https is not None:
        https.close()
    if looking is not None:
        looking.cancel()
    if waker is not None:
        await waker.close()
    clean, _ = await asyncio.gather(proxy.drain(), workers.stop())
    if control is not None:
        await control.close()
    log.info("stopped%s", "" if clean else " (some connections aborted at the deadline)")
    return clean


async def _look_forever(tickets: TicketKeys) -> None:
    while True:
        await asyncio.sleep(LOOK_EVERY_S)
        tickets.look()


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (the default soft limit, often
    1024, is far below what a proxy needs); returns the soft limit in force after. A
    refusal leaves the limit as it was, with a warning: the router still serves."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # Linux refuses more than fs.nr_open
        try:
            hard = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            hard = 1 << 20
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m keelway.router`; returns the exit code."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s router[%(process)d] %(levelname)s %(message)s",
    )
    config = parse_args(sys.argv[1:] if argv is None else argv)
    limit = raise_open_files_limit()
    if config.channel_fd is None:  # the workers would only say it again
        log.info("open-files limit %d", limit)
    predecessor: socket.socket | None = None
    https_sock: socket.socket | None = None
    try:
        if config.takeover is not None:
            try:
                sock, predecessor, https_sock = take_listener(config.takeover)
            except RouterControlError as exc:
                raise RouterStartError(f"cannot take over: {exc}") from exc
            sock.setblocking(False)
            if config.https_fd is not None or config.certs is None:
                # HTTPS on a socket of its own now (a new address), or no longer served.
                if https_sock is not None:
                    https_sock.close()
                https_sock = open_https_listener(config)
            elif https_sock is not None:
                https_sock.setblocking(False)
        else:
            sock = open_listener(config)
            https_sock = open_https_listener(config)
    except RouterStartError as exc:
        log.error("%s", exc)
        return 2
    uvloop.run(serve(config, sock, predecessor, https_sock))
    return 0
