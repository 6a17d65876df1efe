"""A sidecar serving gRPC alone never loads the web side's libraries (Starlette, uvicorn,
Jinja2) nor joserfc: their memory is paid only by a sidecar configured to use them
(docs/performance.md, "Memory of a worker"). Likewise a worker of `serve --workers` with
the default settings (SQLite) loads no optional library: no PostgreSQL driver, no
OpenTelemetry, no notification sinks, no MCP gateway (`python -m bench.memory
--by-library` measures what each library costs)."""

from __future__ import annotations

import json
import pathlib
import pickle
import subprocess
import sys

from toolauthz.server.config import Settings

BUNDLE = pathlib.Path(__file__).resolve().parent.parent / "policies"
WEB_AND_JOSE = ("starlette", "uvicorn", "jinja2", "joserfc", "toolauthz.console", "toolauthz.service.http_api")

_SERVE = """
import json, sys
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings
settings = Settings.model_validate(json.loads(sys.argv[1]))
car = build_sidecar(settings)
server, _ = create_server(car, "127.0.0.1:0")
loaded = [m for m in {modules} if m in sys.modules]
server.stop(None).wait()
car.close()
print(json.dumps(loaded))
"""


def _loaded(tmp_path, **settings) -> list[str]:
    config = {"bundle": str(BUNDLE), "data_dir": str(tmp_path / "data"), "listen": "127.0.0.1:0", **settings}
    done = subprocess.run([sys.executable, "-c", _SERVE.format(modules=repr(WEB_AND_JOSE)), json.dumps(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_grpc_only_sidecar_loads_no_web_library_and_no_joserfc(tmp_path):
    assert _loaded(tmp_path) == []


def test_a_sidecar_serving_the_console_loads_the_web_side(tmp_path):
    loaded = _loaded(tmp_path, console_listen="127.0.0.1:0")
    assert {"starlette", "uvicorn", "jinja2", "toolauthz.console"} <= set(loaded)


# Optional for a worker with the default settings: each is loaded only by a configuration
# that uses it (the store's URL, tracing:, notifications:, decision_log.http, mcp, ...).
OPTIONAL = (*WEB_AND_JOSE, "psycopg", "psycopg_pool", "toolauthz.store.postgres", "opentelemetry",
            "standardwebhooks", "toolauthz.notify", "toolauthz.display.slack", "toolauthz.mcp_proxy", "mcp",
            "httpx", "toolauthz.server.remote_reload", "toolauthz.cli.main", "toolauthz.integrations", "openai",
            "langgraph", "playwright")

# A worker's start as toolauthz/server/worker_group.py's `worker_main` makes it: a fresh
# interpreter (spawn) that imports the target's module, receives the parent's validated
# settings pickled, builds the sidecar and serves the shared listeners.
_WORKER = """
import json, pathlib, pickle, sys, tempfile
import toolauthz.server.worker_group as worker_group
settings = pickle.loads(bytes.fromhex(sys.stdin.read()))
worker_group.configure_decision_log(settings.decision_log)
worker_group.configure_tracing(settings.tracing)
from toolauthz.server.build import build_sidecar
from toolauthz.server.listeners import planned_listeners
from toolauthz.server.serving import drain, start_listeners
car = build_sidecar(settings)
car.share_status(pathlib.Path(tempfile.mkdtemp()), 0)
serving = start_listeners(car, planned_listeners(settings), reuse_port=True)
loaded = [m for m in {modules} if m in sys.modules]
drain(serving, car)
print(json.dumps(loaded))
"""


def _loaded_by_a_worker(tmp_path, **settings) -> list[str]:
    config = Settings.model_validate({"bundle": str(BUNDLE), "data_dir": str(tmp_path / "data"),
                                      "listen": "127.0.0.1:0", **settings})
    done = subprocess.run([sys.executable, "-c", _WORKER.format(modules=repr(OPTIONAL))],
                          input=pickle.dumps(config).hex(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_worker_with_the_default_settings_loads_no_optional_library(tmp_path):
    assert _loaded_by_a_worker(tmp_path) == []


def test_a_worker_that_traces_and_notifies_loads_what_it_uses(tmp_path):
    """The check above can see a library: configured, tracing and the sinks are loaded."""
    loaded = _loaded_by_a_worker(tmp_path, tracing={"exporter": "otlp", "endpoint": "http://127.0.0.1:1"},
                                 notifications={"sinks": [{"name": "chat", "kind": "slack",
                                                           "url": "https://hooks.slack.example/T0/B0/x"}]})
    assert {"opentelemetry", "standardwebhooks", "toolauthz.notify", "toolauthz.display.slack"} <= set(loaded)
