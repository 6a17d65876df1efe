"""The TypeScript SDK (clients/typescript), through the README's test command.

`npm ci` installs its pinned dependencies from package-lock.json when node_modules is
missing or older than the lock; `npm run typecheck` and `npm test` then run its tests
(unit, conformance with the Python SDK, generated code freshness, and the live ones,
which start `.venv/bin/toolauthz serve` on port 0 themselves). `npm pack`'s tarball is
installed into an empty project and used there. Without node, these tests skip on a
developer's machine and fail under CI=true: CI must run them.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
NPM_TIMEOUT = 600


def _npm() -> str:
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node and npm are required under CI=true (.ci/run installs them)")
        pytest.skip("node and npm are not installed")
    return npm


def _run(command: list[str], cwd: pathlib.Path, timeout: float = NPM_TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
           "npm_config_audit": "false"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exit {done.returncode}\n--- stdout\n{done.stdout[-6000:]}" \
                                 f"\n--- stderr\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="module")
def npm() -> str:
    npm = _npm()
    installed = PACKAGE / "node_modules" / ".package-lock.json"
    lock = PACKAGE / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _run([npm, "ci"], PACKAGE)
    return npm


def test_typescript_type_check(npm):
    _run([npm, "run", "typecheck"], PACKAGE)


def test_typescript_tests_pass(npm):
    done = _run([npm, "test"], PACKAGE)
    assert "# fail 0" in done.stdout
    assert "# pass " in done.stdout


def test_the_packed_tarball_installs_into_an_empty_project_and_works(npm, tmp_path):
    packed = _run([npm, "pack", "--json", "--pack-destination", str(tmp_path)], PACKAGE)
    tarball = tmp_path / json.loads(packed.stdout[packed.stdout.index("["):])[0]["filename"]
    names = {entry["path"] for entry in json.loads(packed.stdout[packed.stdout.index("["):])[0]["files"]}
    assert "dist/index.js" in names and "dist/index.d.ts" in names
    assert not any(name.startswith(("src/", "test/", "node_modules/")) for name in names)
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    _run([npm, "install", "--prefer-offline", str(tarball)], project)
    vector = next(c for c in json.loads((ROOT / "tests" / "conformance" / "sdk" / "digests.json").read_text())["cases"]
                  if c["name"] == "utf16_order")
    script = (
        "import { callDigest, parseStrictJson, Guard, AuthzClient } from '@toolauthz/client';\n"
        "const [call, input] = JSON.parse(process.argv[1]);\n"
        "if (typeof Guard !== 'function' || typeof AuthzClient !== 'function') throw new Error('missing exports');\n"
        "// The adapters need no framework installed: they import only its types.\n"
        "const { guardAiTools } = await import('@toolauthz/client/vercel-ai');\n"
        "const { guardAgentTools } = await import('@toolauthz/client/openai-agents');\n"
        "if (typeof guardAiTools !== 'function' || typeof guardAgentTools !== 'function')\n"
        "  throw new Error('no adapters');\n"
        "console.log(callDigest({ tool: call.tool, tenant: call.tenant, callId: call.call_id,\n"
        "  principalType: call.principal.type, principalId: call.principal.id }, parseStrictJson(input)));\n"
    )
    done = _run(["node", "--input-type=module", "-e", script, json.dumps([vector["call"], vector["input_json"]])],
                project, timeout=60)
    assert done.stdout.strip() == vector["expect"]["digest"]
