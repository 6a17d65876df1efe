"""`toolauthz serve --workers N`: N processes answer on one address.

One Python process decides on one core at a time (the GIL), so a sidecar that should
use every core runs one process per core. The workers share the listening port with
SO_REUSEPORT (the kernel spreads incoming connections over them) and share the ledger
and audit files, whose stores take SQLite's write lock with BEGIN IMMEDIATE and are safe
across processes: the audit chain stays one chain, and a token is consumed once whichever
worker the Verify reaches. A Unix socket path is bound by one process: worker 0 serves
the Unix socket listeners, every worker the TCP ones (with only Unix sockets, one process
serves).

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
from typing import TYPE_CHECKING, Any, cast

from sidecar.errors import BundleError, ToolAuthzError
from sidecar.server.config import ListenerSettings, Settings
from sidecar.server.heap import keep_bundles_frozen
from sidecar.server.listener_notices import listener_notices
from sidecar.server.listeners import (
    UNIX_PREFIX,
    parse_address,
    planned_http_listeners,
    planned_listeners,
    split_listen,
)
from sidecar.server.logs import use_log_format
from sidecar.server.observability import MetricsServer, RunDirectory, configure_tracing, start_metrics_server
from sidecar.server.reload_requests import ReloadRequests

if TYPE_CHECKING:
    from sidecar.server.build import Sidecar
    from sidecar.server.serving import Serving

log = logging.getLogger("toolauthz.workers")
# How often a waiting main thread looks for signals that another thread received.
SIGNAL_CHECK_SECONDS = 0.2

START_TIMEOUT_SECONDS = 600.0  # a worker loads the bundle; 10,000 policies take ~30 s
# Beyond the drain grace, what a worker may take to sign its final checkpoint and close.
CLOSE_SECONDS = 25.0


def serve_workers(settings: Settings, workers: int, reloads: ReloadRequests | None = None) -> int:
    """Serve the planned listeners (sidecar/server/listeners.py) from `workers` processes
    until SIGTERM/SIGINT; returns the exit status. Raises what `build_sidecar` raises (BundleError, KeyFileError,
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

    use_log_format(settings.log_format)
    listeners = planned_listeners(settings)  # a wrong address or TLS file is reported before anything starts
    http_listeners = planned_http_listeners(settings)  # likewise for the HTTP API's
    check = build_sidecar(settings)  # the one place a bad bundle or key is reported, once
    version = check.bundles.current.version
    for level, notice in [*listener_notices(listeners, settings.callers),
                          *listener_notices(http_listeners, settings.callers, http=True)]:
        log.log(level, "%s", notice)  # what each listener lets its callers do
    shared = tuple(listener for listener in listeners if not listener.address.startswith(UNIX_PREFIX))
    if workers == 1 or not shared:
        if workers > 1:
            log.info("only Unix socket listeners, which one process binds: serving them from one process")
        return _serve_here(settings, check, version, reloads, listeners)
    if len(shared) < len(listeners):
        log.info("the Unix socket listeners are served by worker 0 only (one process binds a socket path)")
    check.close()
    # The keys exist now: a worker that cannot find them must fail, not generate its own.
    worker_settings = settings.model_copy(update={"generate_missing_keys": False})
    run = RunDirectory.create()  # before the workers are spawned: they inherit its variable
    try:
        metrics_server = start_metrics_server(*split_listen(settings.metrics_listen), run.metrics) \
            if settings.metrics_listen else None
        try:
            group = _WorkerGroup(worker_settings, workers, run)
            # A reload asked for before the workers start needs nothing: they load the bundle then.
            reloads.route_to(lambda: group.signal(signal.SIGHUP))
            with _forwarded_signals(group):
                with contextlib.ExitStack() as reserved:
                    resolved = tuple(_with_reserved_port(reserved, listener) for listener in listeners)
                    # Every worker binds the HTTP API's address too (SO_REUSEPORT), so the kernel
                    # spreads HTTP connections over them as it does gRPC's.
                    http_listen = _reserved_address(reserved, settings.http_listen) if settings.http_listen else ""
                    reserved_http = tuple(_with_reserved_port(reserved, listener)
                                          for listener in settings.http_listeners)
                    # The console likewise: every worker serves it (sidecar/console/__init__.py).
                    console_listen = _reserved_address(reserved, settings.console_listen) \
                        if settings.console_listen else ""
                    group.settings = worker_settings.model_copy(update={"http_listen": http_listen,
                                                                        "http_listeners": reserved_http,
                                                                        "console_listen": console_listen})
                    status = group.start(resolved)
                if status is not None:
                    return status
                # The single-process line, then the workers: whoever parses `on HOST:PORT,` still can.
                http_addresses = [http_listen] if http_listen else [_shown(x.address) for x in reserved_http]
                http = f", HTTP on {', '.join(http_addresses)}" if http_addresses else ""
                print(f"toolauthz serving bundle {settings.bundle} (version {version}) on "
                      f"{', '.join(_shown(listener.address) for listener in resolved)}{http}, "
                      f"data in {settings.data_dir}, {workers} workers "
                      f"(pids {', '.join(str(p) for p in group.pids())})", flush=True)
                _announce_metrics(settings, metrics_server)
                _announce_console(console_listen)
                return group.supervise()
        finally:
            if metrics_server is not None:
                metrics_server.close()
    finally:
        run.close()


def _announce_metrics(settings: Settings, server: MetricsServer | None) -> None:
    if server is not None:
        host = split_listen(settings.metrics_listen)[0]
        print(f"toolauthz metrics on http://{host}:{server.port}/metrics", flush=True)


def _announce_console(address: str) -> None:
    if address:
        print(f"toolauthz console on http://{address}/", flush=True)


def _with_reserved_port(reserved: contextlib.ExitStack, listener: ListenerSettings) -> ListenerSettings:
    """The listener with its port held for the workers (port 0 resolved); a Unix socket
    listener as it is."""
    if listener.address.startswith(UNIX_PREFIX):
        return listener
    return listener.model_copy(update={"address": _reserved_address(reserved, listener.address)})


def _reserved_address(reserved: contextlib.ExitStack, address: str) -> str:
    """`HOST:PORT` with its port held for the workers until `reserved` closes (port 0
    resolved to the port chosen)."""
    host, port = split_listen(address)
    return f"{host}:{reserved.enter_context(_reserved_port(host, port))}"


def _shown(address: str) -> str:
    return str(parse_address(address))


def _serve_here(settings: Settings, sidecar: Sidecar, version: str, reloads: ReloadRequests,
                listeners: tuple[ListenerSettings, ...]) -> int:
    """One worker: serve in this process, exactly as `toolauthz serve` does. Every
    handler is in place before the line that says it serves."""
    from sidecar.server.serving import start_listeners

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    metrics_server = None
    try:
        try:
            configure_tracing(settings.tracing)
            if settings.metrics_listen:
                metrics_server = start_metrics_server(*split_listen(settings.metrics_listen), None)
                sidecar.sample_metrics()
            serving = start_listeners(sidecar, listeners)
            if sidecar.notifier is not None:
                sidecar.notifier.start()
        except BaseException:
            sidecar.close()
            if metrics_server is not None:
                metrics_server.close()
            raise
        reloads.route_to(_reload_of(sidecar))
        keep_bundles_frozen(sidecar)
        http = f", HTTP on {', '.join(serving.http_addresses)}" if serving.http_addresses else ""
        print(f"toolauthz serving bundle {settings.bundle} (version {version}) on "
              f"{', '.join(serving.addresses)}{http}, data in {settings.data_dir}", flush=True)
        _announce_metrics(settings, metrics_server)
        _announce_console(serving.console_address)
        try:
            # Never a wait without a timeout: the kernel may deliver SIGHUP or SIGTERM to
            # one of gRPC's threads, and CPython then runs the handler only when the main
            # thread next runs Python code, which a lock wait with no end never does.
            while not stop.wait(SIGNAL_CHECK_SECONDS):
                pass
        finally:
            reloads.route_to(lambda: None)  # stopping: a reload now would only slow the stop
            drain(serving, sidecar)
            if metrics_server is not None:
                metrics_server.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def drain(serving: Serving, sidecar: Sidecar) -> None:
    """SIGTERM's stop: refuse new calls at once, let the calls in flight finish within
    `drain_grace_seconds` (then cancel them), answer what the decision pump still holds,
    and close the stores after a final signed audit checkpoint."""
    grace = sidecar.settings.drain_grace_seconds
    log.info("draining: new calls are refused; calls in flight have %.1f s to finish", grace)
    try:
        serving.stop(grace=grace)
    finally:
        sidecar.close()
    log.info("drained: final audit checkpoint signed")


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
    def __init__(self, settings: Settings, count: int, run: RunDirectory | None = None):
        """`run`: the run directory the caller made and removes (else the group makes
        one, removed once the workers stopped)."""
        self.settings, self._count = settings, count
        self._owns_run = run is None
        self._run = run if run is not None else RunDirectory.create()
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list = []
        self._stopping = threading.Event()
        self._terminated: set[int] = set()  # pids sent SIGTERM: once is enough
        self._serving: set[int] = set()  # pids that said they serve, so handle SIGHUP
        self._reload_owed: set[int] = set()  # pids asked to reload before they served

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self, listeners: tuple[ListenerSettings, ...]) -> int | None:
        """Start every worker on the TCP `listeners` (worker 0 on the Unix socket ones
        too) and wait until each serves: None. On a failure, print the first worker's
        error once, stop the others and return the exit status."""
        pending: dict[multiprocessing.connection.Connection, Any] = {}  # each worker's pipe -> its process
        shared = tuple(listener for listener in listeners if not listener.address.startswith(UNIX_PREFIX))
        for index in range(self._count):
            parent, child = self._ctx.Pipe(duplex=False)
            mine = listeners if index == 0 else shared
            proc = self._ctx.Process(target=_worker_main,
                                     args=(self.settings, mine, index, child, os.getpid(), self._run.status),
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
            for ready in multiprocessing.connection.wait(list(pending), timeout=min(remaining, 0.5)):
                # wait() returns some of the objects it was given: here, pipe ends.
                conn = cast(multiprocessing.connection.Connection, ready)
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
        deadline = time.monotonic() + self.settings.drain_grace_seconds + CLOSE_SECONDS
        clean = True
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.error("worker %s (pid %s) did not stop; killing it", proc.name, proc.pid)
                proc.kill()
                proc.join()
            if proc.pid is not None:
                self._run.worker_gone(proc.pid)
            if proc.exitcode != 0:
                log.error("worker %s (pid %s) stopped with exit code %s", proc.name, proc.pid, proc.exitcode)
                clean = False
        if self._owns_run:
            self._run.close()
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

def _worker_main(settings: Settings, listeners: tuple[ListenerSettings, ...], index: int, conn: Any,
                 parent: int, status_dir: Any) -> None:
    """Process target: build a sidecar with its own SQLite connections, serve `listeners`
    (TCP ones with SO_REUSEPORT), report ("ready", pid) or ("error", lines), serve until
    SIGTERM, then drain. Its status goes to `status_dir`, its metrics to PROMETHEUS_MULTIPROC_DIR."""
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
    use_log_format(settings.log_format, index)
    if index:  # worker 0 serves the HTTP API's Unix sockets, as it serves gRPC's
        settings = settings.model_copy(update={"http_listeners": tuple(
            listener for listener in settings.http_listeners if not listener.address.startswith(UNIX_PREFIX))})
    from sidecar.server.build import build_sidecar

    try:
        configure_tracing(settings.tracing)
        sidecar = build_sidecar(settings)
    except BundleError as exc:
        conn.send(("error", [str(p) for p in exc.problems]))
        sys.exit(1)
    except (ToolAuthzError, OSError) as exc:
        conn.send(("error", [f"toolauthz: {exc}"]))
        sys.exit(1)
    try:
        sidecar.share_status(status_dir, index)
        if settings.metrics_listen:
            sidecar.sample_metrics()
        serving = _start_shared_listeners(sidecar, listeners)
        if sidecar.notifier is not None:
            sidecar.notifier.start()  # every worker sends; each event is claimed by one
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
    drain(serving, sidecar)


def _start_shared_listeners(sidecar, listeners: tuple[ListenerSettings, ...]):
    from sidecar.server.serving import start_listeners

    return start_listeners(sidecar, listeners, reuse_port=True)


# -- `python -m sidecar.server.workers` -----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`toolauthz serve --workers N` without the rest of the CLI (used by the benchmark)."""
    from sidecar.server.config import load_settings

    reloads = ReloadRequests().install()  # first: a SIGHUP while starting must not kill the sidecar
    use_log_format("text")
    parser = argparse.ArgumentParser(prog="python -m sidecar.server.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle")
    parser.add_argument("--listen")
    parser.add_argument("--data-dir")
    parser.add_argument("--config")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--log-format", choices=["text", "json"])
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config, bundle=args.bundle, listen=args.listen, data_dir=args.data_dir,
                                 log_format=args.log_format)
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
