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
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

from toolauthz.errors import BundleError, ToolAuthzError
from toolauthz.server.config import ListenerSettings, Settings
from toolauthz.server.cpu import available_cpus
from toolauthz.server.decision_shipping import configure_decision_log
from toolauthz.server.heap import keep_bundles_frozen
from toolauthz.server.listener_notices import listener_notices
from toolauthz.server.listeners import (
    UNIX_PREFIX,
    parse_address,
    planned_http_listeners,
    planned_listeners,
    split_listen,
)
from toolauthz.server.logs import banner, configure_logging
from toolauthz.server.observability import MetricsServer, RunDirectory, configure_tracing, start_metrics_server
from toolauthz.server.ports import reserved_address, with_reserved_port
from toolauthz.server.probes import BoundedRead, Readiness
from toolauthz.server.reload_requests import ReloadRequests
from toolauthz.server.worker_group import WorkerGroup, forwarded_signals

if TYPE_CHECKING:
    from toolauthz.server.sidecar import Sidecar

__all__ = ["ReloadRequests", "serve_workers", "drain", "configure_process_logging", "main"]

log = logging.getLogger("toolauthz.workers")
# How often a waiting main thread looks for signals that another thread received.
SIGNAL_CHECK_SECONDS = 0.2


def configure_process_logging(settings: Settings, worker: int | None = None) -> None:
    """Logging and the decision log of this process, from the settings."""
    configure_logging(settings.log_format, worker, settings.log_level, settings.decision_log.enabled)
    configure_decision_log(settings.decision_log)


def drain(serving, sidecar) -> None:
    """SIGTERM's stop (toolauthz/server/serving.py)."""
    from toolauthz.server.serving import drain as drain_serving

    drain_serving(serving, sidecar)


def serve_workers(settings: Settings, workers: int, reloads: ReloadRequests | None = None) -> int:
    """Serve the planned listeners (toolauthz/server/listeners.py) from `workers` processes
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
    from toolauthz.server.build import build_sidecar

    configure_process_logging(settings)
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
        # The parent is ready while its workers serve: it starts them all or exits, and
        # stops them all when one dies.
        readiness = Readiness()
        metrics_server = start_metrics_server(*split_listen(settings.metrics_listen), run.metrics, readiness) \
            if settings.metrics_listen else None
        try:
            group = WorkerGroup(worker_settings, workers, run)
            # A reload asked for before the workers start needs nothing: they load the bundle then.
            reloads.route_to(lambda: group.signal(signal.SIGHUP))
            with forwarded_signals(group, stopping=readiness.draining):
                with contextlib.ExitStack() as reserved:
                    resolved = tuple(with_reserved_port(reserved, listener) for listener in listeners)
                    # Every worker binds the HTTP API's address too (SO_REUSEPORT), so the kernel
                    # spreads HTTP connections over them as it does gRPC's.
                    http_listen = reserved_address(reserved, settings.http_listen) if settings.http_listen else ""
                    reserved_http = tuple(with_reserved_port(reserved, listener)
                                          for listener in settings.http_listeners)
                    # The console likewise: every worker serves it (toolauthz/console/__init__.py).
                    console_listen = reserved_address(reserved, settings.console_listen) \
                        if settings.console_listen else ""
                    group.settings = worker_settings.model_copy(update={"http_listen": http_listen,
                                                                        "http_listeners": reserved_http,
                                                                        "console_listen": console_listen})
                    status = group.start(resolved)
                if status is not None:
                    return status
                readiness.serving()  # before the lines that say so: whoever reads them may probe at once
                # The single-process line, then the workers: whoever parses `on HOST:PORT,` still can.
                http_addresses = [http_listen] if http_listen else [_shown(x.address) for x in reserved_http]
                _announce_serving(settings, version, [_shown(listener.address) for listener in resolved],
                                  http_addresses, workers=workers, pids=group.pids())
                _announce_metrics(settings, metrics_server)
                _announce_console(console_listen)
                try:
                    return group.supervise()
                finally:
                    readiness.draining()
        finally:
            if metrics_server is not None:
                metrics_server.close()
    finally:
        run.close()


def _announce_serving(settings: Settings, version: str, addresses: list[str], http_addresses: list[str], *,
                      workers: int = 1, pids: list[int] | None = None) -> None:
    """The line that says the sidecar serves: on standard output, text or JSON."""
    http = f", HTTP on {', '.join(http_addresses)}" if http_addresses else ""
    processes = f", {workers} workers (pids {', '.join(str(p) for p in pids)})" if pids else ""
    source = settings.bundle_server.url if settings.bundle_server is not None else str(settings.bundle)
    banner("toolauthz serving bundle %s (version %s) on %s%s, data in %s, store %s%s", source, version,
           ", ".join(addresses), http, settings.data_dir, settings.store_shown, processes,
           bundle=source, policy_version=version, listen=addresses, http_listen=http_addresses,
           data_dir=str(settings.data_dir), store=settings.store_shown, workers=workers, pids=pids or [])


def _announce_metrics(settings: Settings, server: MetricsServer | None) -> None:
    if server is not None:
        host = split_listen(settings.metrics_listen)[0]
        url = f"http://{host}:{server.port}/metrics"
        banner("toolauthz metrics on %s", url, metrics_url=url)


def _announce_console(address: str) -> None:
    if address:
        url = f"http://{address}/"
        banner("toolauthz console on %s", url, console_url=url)


def _shown(address: str) -> str:
    return str(parse_address(address))


def _serve_here(settings: Settings, sidecar: Sidecar, version: str, reloads: ReloadRequests,
                listeners: tuple[ListenerSettings, ...]) -> int:
    """One worker: serve in this process, exactly as `toolauthz serve` does. Every
    handler is in place before the line that says it serves."""
    from toolauthz.server.serving import drain, reload_of, start_listeners

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    metrics_server = None
    readiness = Readiness()
    try:
        try:
            configure_tracing(settings.tracing)
            if settings.metrics_listen:
                metrics_server = start_metrics_server(*split_listen(settings.metrics_listen), None, readiness)
                sidecar.sample_metrics()
            serving = start_listeners(sidecar, listeners)
            if sidecar.notifier is not None:
                sidecar.notifier.start()
        except BaseException:
            sidecar.close()
            if metrics_server is not None:
                metrics_server.close()
            raise
        reloads.route_to(reload_of(sidecar))
        keep_bundles_frozen(sidecar)
        # Ready before the lines that say it serves: whoever reads them may probe at once.
        readiness.serving(BoundedRead(sidecar.store.available, settings.store_hang_seconds))
        _announce_serving(settings, version, list(serving.addresses), list(serving.http_addresses))
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
            readiness.draining()
            drain(serving, sidecar)
            if metrics_server is not None:
                metrics_server.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


# -- `python -m toolauthz.server.workers` -----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`toolauthz serve --workers N` without the rest of the CLI (used by the benchmark)."""
    from toolauthz.server.config import load_settings

    reloads = ReloadRequests().install()  # first: a SIGHUP while starting must not kill the sidecar
    configure_logging("text")
    parser = argparse.ArgumentParser(prog="python -m toolauthz.server.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle")
    parser.add_argument("--listen")
    parser.add_argument("--data-dir")
    parser.add_argument("--config")
    parser.add_argument("--workers", type=int, default=available_cpus())
    parser.add_argument("--log-format", choices=["text", "json"])
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config, bundle=args.bundle, listen=args.listen, data_dir=args.data_dir,
                                 log_format=args.log_format, log_level=args.log_level)
        return serve_workers(settings, args.workers, reloads)
    except BundleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except (ToolAuthzError, OSError) as exc:
        print(f"toolauthz: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    # Through the package name, so that the workers' target pickles as toolauthz.server.workers.*
    from toolauthz.server.workers import main as _main

    sys.exit(_main())
