"""Serving the metrics and the HTTP probes, choosing the trace exporter, and the per-run directory.

Who serves /metrics: with `--workers N` the parent process. It decides nothing and
outlives every worker, so a scrape never lands on a worker that is starting or
stopping, and the workers' port (shared with SO_REUSEPORT) stays gRPC alone. The
workers write their values to files in the run's `metrics/` directory
(prometheus_client's multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`, set before they are
spawned), and the parent serves the sum. A single-process sidecar serves its own values.

The run directory (`toolauthz-run-*` under the system's temporary directory, mode 0700)
is made fresh at start, so no value of an earlier run is summed in, and removed at exit;
it also holds the workers' status files (toolauthz/server/worker_status.py).
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import make_server

from toolauthz.server.config import TracingSettings
from toolauthz.server.probes import Readiness, probe_app
from toolauthz.service.loopback import address_host_header, is_loopback_host, loopback_host_header
from toolauthz.telemetry import tracing

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("toolauthz.observability")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class RunDirectory:
    """One run's shared directory; `close` removes it and restores the environment."""

    path: pathlib.Path
    _previous_env: str | None = None

    @property
    def metrics(self) -> pathlib.Path:
        return self.path / "metrics"

    @property
    def status(self) -> pathlib.Path:
        return self.path / "status"

    @classmethod
    def create(cls) -> RunDirectory:
        path = pathlib.Path(tempfile.mkdtemp(prefix="toolauthz-run-"))
        run = cls(path, os.environ.get(MULTIPROC_ENV))
        run.metrics.mkdir(mode=0o700)
        run.status.mkdir(mode=0o700)
        # Read by prometheus_client when a worker first imports it (spawned workers
        # inherit the environment).
        os.environ[MULTIPROC_ENV] = str(run.metrics)
        return run

    def worker_gone(self, pid: int) -> None:
        """Drop a stopped worker's live gauges (its counters keep counting in the sum)."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(self.metrics))  # type: ignore[no-untyped-call]  # unannotated upstream

    def close(self) -> None:
        if self._previous_env is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = self._previous_env
        shutil.rmtree(self.path, ignore_errors=True)


class MetricsServer:
    """Prometheus text at http://HOST:PORT/metrics on a thread of its own."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread):
        self._httpd, self._thread = httpd, thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def start_metrics_server(host: str, port: int, multiprocess_dir: pathlib.Path | None,
                         readiness: Readiness | None = None) -> MetricsServer:
    """Serve this process's metrics, or (with `multiprocess_dir`) the sum of every
    process that wrote there, with the probes beside them (toolauthz/server/probes.py).
    OSError when the address cannot be bound."""
    from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = REGISTRY
    if multiprocess_dir is not None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(multiprocess_dir))  # type: ignore[no-untyped-call]  # unannotated upstream
    address = host.strip("[]")
    answers_host = loopback_host_header if is_loopback_host(address) else address_host_header
    app = probe_app(make_wsgi_app(registry), readiness or Readiness(), answers_host)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    try:
        httpd = make_server(address, port, app, Server, handler_class=_SilentHandler)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def configure_tracing(settings: TracingSettings) -> None:
    """The configured exporter, or none. OTLP (over gRPC) comes from
    opentelemetry-exporter-otlp-proto-grpc, in the runtime lock; should an install lack
    it, the sidecar says so once and records no spans (tracing never stops it serving)."""
    if settings.exporter == "none":
        tracing.use_tracer_provider(None)
        return
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter,
        )
    except ImportError:
        log.warning("tracing.exporter is otlp but opentelemetry-exporter-otlp is not installed; no spans are exported")
        tracing.use_tracer_provider(None)
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "toolauthz"}))
    exporter = OTLPSpanExporter(endpoint=settings.endpoint) if settings.endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
