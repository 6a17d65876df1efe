"""`toolauthz serve --workers N`: N processes answer on one address.

One Python process decides on one core at a time (the GIL), so a sidecar that should
use every core runs one process per core. The workers share the listening port with
SO_REUSEPORT (the kernel spreads incoming connections over them) and share the ledger
and audit files, whose stores take SQLite's write lock with BEGIN IMMEDIATE and are safe
across processes: the audit chain stays one chain, and a token is consumed once whichever
worker the Verify reaches.

The parent:
  * checks everything once before any worker starts: it builds (and closes) a complete
    sidecar, so a bad bundle, config or key is reported once, and development keys are
    generated once rather than raced for by N workers;
  * refuses an address another process is already listening on (SO_REUSEPORT would
    otherwise silently share it) and resolves port 0 to one port for every worker;
  * starts the workers (spawn), waits until each one serves, forwards SIGTERM, SIGINT
    and SIGHUP (bundle reload) to them, and exits non-zero when a worker fails to start
    or dies while serving (the remaining workers are stopped first).

SIGHUP never kills a starting sidecar: `ReloadRequests` handles it from the first moment
of `serve_workers` (and of a worker) on, before anything says "serving"; a request made
before the reloader runs is honoured once it does. The parent sends SIGHUP to a worker
only once that worker has said it serves, since a spawned process cannot handle a signal
before its own code runs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from sidecar.display import use_escaping_formatter
from sidecar.errors import BundleError, ToolAuthzError
from sidecar.server.config import Settings
from sidecar.server.heap import keep_bundles_frozen

if TYPE_CHECKING:
    from sidecar.server.build import Sidecar

log = logging.getLogger("toolauthz.workers")

START_TIMEOUT_SECONDS = 600.0  # a worker loads the bundle; 10,000 policies take ~30 s
STOP_GRACE_SECONDS = 5.0  # in-flight calls get this long (as in `toolauthz serve`)
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ReloadRequests:
    """SIGHUP as a request to reload the bundle, from the moment this is entered: one
    that arrives before a reloader is attached (`route_to`) is kept and passed on then,
    so a SIGHUP at any moment of startup neither kills the process nor is lost."""

    def __init__(self) -> None:
        self._asked = False
        self._reload: Callable[[], None] | None = None
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def install(self) -> ReloadRequests:
        self._previous = signal.signal(signal.SIGHUP, self._on_hup)
        # A supervisor may start the sidecar with SIGHUP blocked: what it holds back
        # arrives now, when it is handled.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        return self

    def route_to(self, reload: Callable[[], None]) -> None:
        self._reload = reload
        if self._asked:
            self._asked = False
            reload()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        if self._reload is None:
            self._asked = True
        else:
            self._reload()

    def __enter__(self) -> ReloadRequests:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        signal.signal(signal.SIGHUP, self._previous if self._previous is not None else signal.SIG_DFL)


def serve_workers(settings: Settings, workers: int, reloads: ReloadRequests | None = None) -> int:
    """Serve `settings.listen` from `workers` processes until SIGTERM/SIGINT; returns the
    exit status. Raises what `build_sidecar` raises (BundleError, KeyFileError,
    StoreUnavailable, ...) and OSError for an unusable address, before any worker starts.
    `reloads`: SIGHUP handling the caller installed earlier still (else installed here)."""
    if workers < 1:
        raise ToolAuthzError(f"--workers must be at least 1, not {workers}")
    if reloads is not None:
        return _serve(settings, workers, reloads)
    with ReloadRequests() as reloads:
        return _serve(settings, workers, reloads)


def _serve(settings: Settings, workers: int, reloads: ReloadRequests) -> int:
    from sidecar.server.build import build_sidecar

    check = build_sidecar(settings)  # the one place a bad bundle or key is reported, once
    version = check.bundles.current.version
    if workers == 1:
        return _serve_here(settings, check, version, reloads)
    check.close()
    # The keys exist now: a worker that cannot find them must fail, not generate its own.
    worker_settings = settings.model_copy(update={"generate_missing_keys": False})
    host, port = split_listen(settings.listen)
    group = _WorkerGroup(worker_settings, workers)
    # A reload asked for before the workers start needs nothing: they load the bundle then.
    reloads.route_to(lambda: group.signal(signal.SIGHUP))
    with _forwarded_signals(group):
        with _reserved_port(host, port) as port, _reserved_http_port(settings.http_listen) as http_listen:
            group.settings = worker_settings.model_copy(update={"http_listen": http_listen})
            status = group.start(f"{host}:{port}")
        if status is not None:
            return status
        # The single-process line, then the workers: whoever parses `on HOST:PORT,` still can.
        http = f", HTTP on {group.settings.http_listen}" if group.settings.http_listen else ""
        print(f"toolauthz serving bundle {settings.bundle} (version {version}) on {host}:{port}{http}, "
              f"data in {settings.data_dir}, {workers} workers (pids {', '.join(str(p) for p in group.pids())})",
              flush=True)
        return group.supervise()


@contextlib.contextmanager
def _reserved_http_port(http_listen: str) -> Iterator[str]:
    """The HTTP API's address for every worker: each one binds it with SO_REUSEPORT, as
    it binds the gRPC address, so the kernel spreads HTTP connections over the workers
    too and any worker answers (they share the ledger)."""
    if not http_listen:
        yield ""
        return
    host, port = split_listen(http_listen)
    with _reserved_port(host, port) as port:
        yield f"{host}:{port}"


def split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ToolAuthzError(f"listen address must be HOST:PORT, not `{listen}`")
    return host, int(port)


def _serve_here(settings: Settings, sidecar: Sidecar, version: str, reloads: ReloadRequests) -> int:
    """One worker: serve in this process, exactly as `toolauthz serve` does. Every
    handler is in place before the line that says it serves."""
    from sidecar.server.build import create_server

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server, port = create_server(sidecar)
        except BaseException:
            sidecar.close()
            raise
        reloads.route_to(_reload_of(sidecar))
        keep_bundles_frozen(sidecar)
        host = split_listen(settings.listen)[0]
        http = f", HTTP on {split_listen(settings.http_listen)[0]}:{server.http_port}" if server.http_port else ""
        print(f"toolauthz serving bundle {settings.bundle} (version {version}) on {host}:{port}{http}, "
              f"data in {settings.data_dir}", flush=True)
        try:
            stop.wait()
        finally:
            reloads.route_to(lambda: None)  # stopping: a reload now would only slow the stop
            server.stop(grace=STOP_GRACE_SECONDS).wait()
            sidecar.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _reload_of(sidecar: Sidecar) -> Callable[[], None]:
    reloader = sidecar.reloader
    return reloader.trigger if reloader is not None else (lambda: None)


# -- the port ----------------------------------------------------------------------------

@contextlib.contextmanager
def _reserved_port(host: str, port: int) -> Iterator[int]:
    """Refuse an address in use; for port 0, hold a port every worker can join.

    The workers bind with SO_REUSEPORT, which also lets them join a port some other
    program happens to listen on with that option: so first bind without it, which fails
    if anyone holds the port. For port 0, a socket bound (not listening) with
    SO_REUSEPORT keeps the chosen port ours until the workers listen on it; a socket
    that does not listen receives no connections."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    bind_host = host.strip("[]")
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                probe.bind((bind_host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise OSError(f"cannot listen on {host}:{port}: the address is in use") from None
                raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        yield port
        return
    with socket.socket(family, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            holder.bind((bind_host, 0))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:0: {exc.strerror}") from None
        yield holder.getsockname()[1]


# -- the parent ----------------------------------------------------------------------------

class _WorkerGroup:
    def __init__(self, settings: Settings, count: int):
        self.settings, self._count = settings, count
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list = []
        self._stopping = threading.Event()
        self._terminated: set[int] = set()  # pids sent SIGTERM: once is enough
        self._serving: set[int] = set()  # pids that said they serve, so handle SIGHUP
        self._reload_owed: set[int] = set()  # pids asked to reload before they served

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self, address: str) -> int | None:
        """Start every worker on `address` and wait until each serves: None. On a failure,
        print the first worker's error once, stop the others and return the exit status."""
        pending = {}
        for index in range(self._count):
            parent, child = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(target=_worker_main, args=(self.settings, address, index, child, os.getpid()),
                                     name=f"toolauthz-worker-{index}",
                                     daemon=True)  # should the parent fail, its exit stops them
            proc.start()
            child.close()
            self._procs.append(proc)
            pending[parent] = proc
        errors: list[list[str]] = []
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while pending and not errors and not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append([f"toolauthz: a worker did not start within {START_TIMEOUT_SECONDS:.0f} s"])
                break
            for conn in multiprocessing.connection.wait(list(pending), timeout=min(remaining, 0.5)):
                proc = pending.pop(conn)
                try:
                    kind, payload = conn.recv()
                except EOFError:  # died before it could say why (killed, crashed)
                    proc.join(1)
                    kind, payload = "error", [f"toolauthz: worker {proc.name} exited with code {proc.exitcode} "
                                              "while starting"]
                conn.close()
                if kind == "error":
                    errors.append(payload)
                else:
                    self._now_serving(payload)
        for conn in pending:
            conn.close()
        if not errors and not self._stopping.is_set():
            return None
        for line in errors[0] if errors else ():  # the workers share one config: one report is enough
            print(line, file=sys.stderr, flush=True)
        clean = self.stop()
        return 1 if errors or not clean else 0

    def supervise(self) -> int:
        """Wait for a signal or a worker's death; then stop them all."""
        while not self._stopping.is_set():
            by_sentinel = {p.sentinel: p for p in self._procs}
            ready = multiprocessing.connection.wait(list(by_sentinel), timeout=0.5)
            if ready:
                if self._stopping.is_set():
                    break
                dead = by_sentinel[ready[0]]
                dead.join(5)  # its sentinel closes a moment before it can be reaped
                log.error("worker %s (pid %s) exited with code %s; stopping the others", dead.name, dead.pid,
                          dead.exitcode)
                self.stop()
                return 1
        return 0 if self.stop() else 1

    def _now_serving(self, pid: int) -> None:
        self._serving.add(pid)
        if pid in self._reload_owed:
            self._reload_owed.discard(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)

    def signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._stopping.set()
            signum = signal.SIGTERM
        for proc in self._procs:
            if signum == signal.SIGHUP and proc.pid not in self._serving:
                # Before its own code runs, SIGHUP would kill a spawned worker.
                self._reload_owed.add(proc.pid)
                continue
            if proc.is_alive() and proc.pid not in self._terminated:
                if signum == signal.SIGTERM:
                    self._terminated.add(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    def stop(self) -> bool:
        """SIGTERM every worker, wait for its graceful stop, kill what remains. True when
        every worker stopped cleanly (exit code 0)."""
        self._stopping.set()
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 25
        clean = True
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.error("worker %s (pid %s) did not stop; killing it", proc.name, proc.pid)
                proc.kill()
                proc.join()
            if proc.exitcode != 0:
                log.error("worker %s (pid %s) stopped with exit code %s", proc.name, proc.pid, proc.exitcode)
                clean = False
        return clean


@contextlib.contextmanager
def _forwarded_signals(group: _WorkerGroup) -> Iterator[None]:
    signals = (signal.SIGTERM, signal.SIGINT)  # SIGHUP: ReloadRequests routes it to the group
    previous = {sig: signal.signal(sig, lambda signum, _frame: group.signal(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- a worker ------------------------------------------------------------------------------

def _worker_main(settings: Settings, address: str, index: int, conn, parent: int) -> None:
    """Process target: build a sidecar with its own SQLite connections, serve `address`
    with SO_REUSEPORT, report ("ready", pid) or ("error", lines), serve until SIGTERM."""
    stop = threading.Event()

    def on_stop(*_) -> None:
        # A second SIGINT/SIGTERM (Ctrl-C reaches the whole process group, and the parent
        # forwards it too) must not kill a worker halfway through its graceful stop; the
        # parent kills a worker that overstays the grace period.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        stop.set()

    reloads = ReloadRequests().install()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    use_escaping_formatter(logging.INFO, _LOG_FORMAT.replace("%(name)s", f"%(name)s[{index}]"))
    from sidecar.server.build import build_sidecar

    try:
        sidecar = build_sidecar(settings)
    except BundleError as exc:
        conn.send(("error", [str(p) for p in exc.problems]))
        sys.exit(1)
    except (ToolAuthzError, OSError) as exc:
        conn.send(("error", [f"toolauthz: {exc}"]))
        sys.exit(1)
    try:
        server, _port = _create_shared_server(sidecar, address)
    except Exception as exc:  # noqa: BLE001 - reported once by the parent
        sidecar.close()
        conn.send(("error", [f"toolauthz: {exc}"]))
        sys.exit(1)
    reloads.route_to(_reload_of(sidecar))
    keep_bundles_frozen(sidecar)
    conn.send(("ready", os.getpid()))
    conn.close()
    while not stop.wait(1.0):
        if os.getppid() != parent:  # the parent was killed (maybe before we started): stop
            log.error("the parent process is gone; stopping")
            break
    server.stop(grace=STOP_GRACE_SECONDS).wait()
    sidecar.close()


def _create_shared_server(sidecar, address: str):
    from sidecar.server.build import create_server

    return create_server(sidecar, address, reuse_port=True)


# -- `python -m sidecar.server.workers` -----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`toolauthz serve --workers N` without the rest of the CLI (used by the benchmark)."""
    from sidecar.server.config import load_settings

    reloads = ReloadRequests().install()  # first: a SIGHUP while starting must not kill the sidecar
    use_escaping_formatter(logging.INFO, _LOG_FORMAT)
    parser = argparse.ArgumentParser(prog="python -m sidecar.server.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle")
    parser.add_argument("--listen")
    parser.add_argument("--data-dir")
    parser.add_argument("--config")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config, bundle=args.bundle, listen=args.listen, data_dir=args.data_dir)
        return serve_workers(settings, args.workers, reloads)
    except BundleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except (ToolAuthzError, OSError) as exc:
        print(f"toolauthz: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    # Through the package name, so that the workers' target pickles as sidecar.server.workers.*
    from sidecar.server.workers import main as _main

    sys.exit(_main())
