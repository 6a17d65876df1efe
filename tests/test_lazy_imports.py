"""A sidecar serving gRPC alone never loads the web side's libraries (Starlette, uvicorn,
Jinja2) nor joserfc: their memory is paid only by a sidecar configured to use them
(docs/performance.md, "Memory of a worker")."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

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
