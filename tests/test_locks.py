"""The locks: requirements.lock is exactly the server's runtime (the closure of the
project's dependencies and its `server` extra, nothing a test or a checker needs),
requirements-client.lock exactly the SDK's (the closure of the dependencies alone, at
the runtime lock's versions), requirements-dev.lock adds the tools on top of the
runtime, requirements-integrations.lock the agent frameworks on top of that, and each
package is pinned once."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from conftest import ROOT
from packaging.requirements import Requirement

DEV_TOOLS = {"pytest", "hypothesis", "mypy", "ruff", "playwright", "kubernetes-validate", "grpcio-tools",
             "openapi-spec-validator"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "-r ")):
            name, version = line.split("==")
            assert _norm(name) not in pins, f"{name} pinned twice in {path.name}"
            pins[_norm(name)] = version
    return pins


def _closure(roots: list[str]) -> set[str]:
    """Every distribution the roots need, from the installed packages' metadata."""
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [Requirement(root) for root in roots]
    while stack:
        requirement = stack.pop()
        key = (_norm(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.distribution(requirement.name).requires or []:
            needed = Requirement(text)
            extras = requirement.extras or {""}
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                stack.append(needed)
    return {name for name, _ in seen}


def test_the_runtime_lock_is_exactly_what_the_project_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _pins(ROOT / "requirements.lock")
    assert set(runtime) == _closure(project["dependencies"] + project["optional-dependencies"]["server"])
    assert not {_norm(tool) for tool in DEV_TOOLS} & set(runtime)
    assert not [name for name in runtime if name.startswith("types-")]
    assert "opentelemetry-exporter-otlp-proto-grpc" in runtime and "python-json-logger" in runtime


def test_the_dev_lock_adds_the_tools_on_top_of_the_runtime_lock():
    text = (ROOT / "requirements-dev.lock").read_text()
    assert "-r requirements.lock" in text.splitlines()
    dev, runtime = _pins(ROOT / "requirements-dev.lock"), _pins(ROOT / "requirements.lock")
    assert not set(dev) & set(runtime)
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert {_norm(Requirement(r).name) for r in test_extra} <= set(dev) | set(runtime)
    for name, version in {**runtime, **dev}.items():
        assert metadata.version(name) == version, f"{name}: installed {metadata.version(name)}, locked {version}"


SERVER_ONLY = {"cedarpy", "starlette", "uvicorn", "psycopg", "mcp", "pydantic", "jinja2", "opentelemetry-sdk"}


def test_the_client_lock_is_exactly_the_sdk_at_the_runtime_locks_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client, runtime = _pins(ROOT / "requirements-client.lock"), _pins(ROOT / "requirements.lock")
    assert set(client) == _closure(project["dependencies"])
    assert not SERVER_ONLY & set(client)
    assert {name: runtime.get(name) for name in client} == client


def test_the_integrations_lock_adds_only_the_frameworks_and_what_they_need():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    runtime, dev = _pins(ROOT / "requirements.lock"), _pins(ROOT / "requirements-dev.lock")
    frameworks = _pins(ROOT / "requirements-integrations.lock")
    assert not set(frameworks) & (set(runtime) | set(dev))
    assert set(frameworks) == _closure(extras["openai-agents"] + extras["langgraph"]) - set(runtime) - set(dev)
    assert {"openai-agents", "langgraph", "langchain-core"} <= set(frameworks)
    for name, version in frameworks.items():
        assert metadata.version(name) == version, f"{name}: installed {metadata.version(name)}, locked {version}"


def test_the_docs_lock_adds_only_the_site_builder_and_what_it_needs():
    below = {**_pins(ROOT / "requirements.lock"), **_pins(ROOT / "requirements-dev.lock"),
             **_pins(ROOT / "requirements-integrations.lock"), **_pins(ROOT / "requirements-integrations-b.lock")}
    docs = _pins(ROOT / "requirements-docs.lock")
    assert not set(docs) & set(below)
    assert set(docs) == _closure(["mkdocs", "mkdocs-material"]) - set(below)
    for name, version in docs.items():
        assert metadata.version(name) == version, f"{name}: installed {metadata.version(name)}, locked {version}"
