"""`pip install toolauthz` is the runtime SDK alone: a fresh venv that holds only
requirements-client.lock and the package has none of the server's dependencies, runs
`from toolauthz.client import Guard` against a live sidecar, and its `toolauthz` script
refuses the server's commands naming the extra.

Offline: the SDK's wheels come from the wheelhouse scripts/setup.sh --dev downloads
(.venv/wheelhouse-client), and the package's own wheel is built here with the main venv's
setuptools, without build isolation, from a copy of the sources (the work tree stays clean).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import venv

import pytest
from conftest import ROOT, order_entity

WHEELHOUSE = ROOT / ".venv" / "wheelhouse-client"
# Distributions of the server extra (and what only they pull in) that must not be there.
SERVER_DISTRIBUTIONS = {"cedarpy", "starlette", "uvicorn", "psycopg", "psycopg-binary", "psycopg-pool", "mcp",
                        "pydantic", "jinja2", "opentelemetry-sdk", "joserfc", "jsonschema-rs", "prometheus-client",
                        "grpcio-health-checking", "grpcio-reflection", "standardwebhooks", "ruamel-yaml", "anyio"}

_GUARD_SCRIPT = textwrap.dedent("""
    import json, sys

    import grpc
    from toolauthz.client import AuthzClient, Guard, Principal, ToolSet, TrustedContext

    port, entity = sys.argv[1], json.loads(sys.argv[2])
    runs = []
    tools = ToolSet()
    tools.register("lookup_order", lambda args, call: runs.append(call.call_id) or {"order_id": args["order_id"],
                                                                                    "status": "shipped"})
    context = TrustedContext("acme", Principal("User", "alice"), "run-1", entities=lambda call: [entity])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        guard = Guard(AuthzClient(channel, timeout=10.0), context, tools)
        first = guard.run("toolu_sdk_1", "lookup_order", '{"order_id": "ord_2"}')
        again = guard.run("toolu_sdk_1", "lookup_order", '{"order_id": "ord_2"}')
    print(json.dumps({"status": first.status, "executed": first.executed, "reported": first.reported,
                      "replayed": again.replayed, "runs": runs}))
""")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> pathlib.Path:
    assert WHEELHOUSE.is_dir(), f"no wheelhouse at {WHEELHOUSE}: run scripts/setup.sh --dev"
    work = tmp_path_factory.mktemp("client-install")
    source = work / "src"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "toolauthz", source / "toolauthz", ignore=shutil.ignore_patterns("__pycache__"))
    offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(work / "dist"), str(source)],
                           env=offline, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    [wheel] = (work / "dist").glob("toolauthz-*.whl")
    target = work / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    # --no-index: every dependency the wheel declares must be in the client lock's wheelhouse
    installed = subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                                "--find-links", str(WHEELHOUSE), "-r", str(ROOT / "requirements-client.lock"),
                                str(wheel)], env=offline, capture_output=True, text=True, timeout=180)
    assert installed.returncode == 0, installed.stderr
    return target


def test_the_sdk_installs_alone_with_no_server_dependency(client_venv):
    listed = subprocess.run([str(client_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                            env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, capture_output=True, text=True,
                            timeout=60, check=True)
    names = {_norm(d["name"]) for d in json.loads(listed.stdout)} - {"pip", "setuptools", "toolauthz"}
    locked = {_norm(line.split("==")[0]) for line in (ROOT / "requirements-client.lock").read_text().splitlines()
              if line and not line.startswith("#")}
    assert names == locked
    assert not names & SERVER_DISTRIBUTIONS


def test_the_sdk_guards_a_call_against_a_live_sidecar(client_venv, server, sidecar):
    _srv, port = server
    done = subprocess.run([str(client_venv / "bin" / "python"), "-c", _GUARD_SCRIPT, str(port),
                           json.dumps(order_entity("ord_2", "alice"))],
                          cwd=client_venv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"status": "completed", "executed": True, "reported": "recorded",
                                       "replayed": True, "runs": ["toolu_sdk_1"]}
    assert sidecar.ledger.get("acme", "toolu_sdk_1").outcome == "completed"


@pytest.mark.parametrize("command", [["serve", "--config", "toolauthz.yaml"], ["check", "policies"], ["--help"]])
def test_the_console_script_refuses_server_commands_naming_the_extra(client_venv, command):
    done = subprocess.run([str(client_venv / "bin" / "toolauthz"), *command], cwd=client_venv,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "pip install 'toolauthz[server]'" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
