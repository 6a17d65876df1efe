"""The parent's group of worker processes (spawned, each serving the shared listeners)
and a worker's own life: build, serve, report, drain."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from toolauthz.errors import BundleError, ToolAuthzError
from toolauthz.server.config import ListenerSettings, Settings
from toolauthz.server.decision_shipping import configure_decision_log
from toolauthz.server.heap import keep_bundles_frozen
from toolauthz.server.listeners import UNIX_PREFIX
from toolauthz.server.logs import configure_logging, report_problems
from toolauthz.server.observability import RunDirectory, configure_tracing
from toolauthz.server.reload_requests import ReloadRequests

log = logging.getLogger("toolauthz.workers")

START_TIMEOUT_SECONDS = 600.0  # a worker loads the bundle; 10,000 policies take ~30 s
# Beyond the drain grace, what a worker may take to sign its final checkpoint and close.
CLOSE_SECONDS = 25.0


class WorkerGroup:
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
            proc = self._ctx.Process(target=worker_main,
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
        if errors:  # the workers share one config: one report is enough
            report_problems("a worker could not start", errors[0], self.settings.log_format)
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
def forwarded_signals(group: WorkerGroup, stopping: Callable[[], None] = lambda: None) -> Iterator[None]:
    """SIGTERM and SIGINT go to every worker; `stopping` is told first (readiness turns
    NOT_SERVING as the drain begins)."""
    signals = (signal.SIGTERM, signal.SIGINT)  # SIGHUP: ReloadRequests routes it to the group

    def forward(signum: int, _frame: Any) -> None:
        stopping()
        group.signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- a worker ------------------------------------------------------------------------------

def worker_main(settings: Settings, listeners: tuple[ListenerSettings, ...], index: int, conn: Any,
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
    configure_logging(settings.log_format, index, settings.log_level, settings.decision_log.enabled)
    try:
        configure_decision_log(settings.decision_log)
    except ToolAuthzError as exc:
        conn.send(("error", [f"toolauthz: {exc}"]))
        sys.exit(1)
    if index:  # worker 0 serves the HTTP API's Unix sockets, as it serves gRPC's
        settings = settings.model_copy(update={"http_listeners": tuple(
            listener for listener in settings.http_listeners if not listener.address.startswith(UNIX_PREFIX))})
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.serving import drain, reload_of

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
    reloads.route_to(reload_of(sidecar))
    keep_bundles_frozen(sidecar)
    conn.send(("ready", os.getpid()))
    conn.close()
    while not stop.wait(1.0):
        if os.getppid() != parent:  # the parent was killed (maybe before we started): stop
            log.error("the parent process is gone; stopping")
            break
    drain(serving, sidecar)


def _start_shared_listeners(sidecar, listeners: tuple[ListenerSettings, ...]):
    from toolauthz.server.serving import start_listeners

    return start_listeners(sidecar, listeners, reuse_port=True)
