"""The two locks: requirements.lock is exactly the runtime (the closure of the project's
dependencies, nothing a test or a checker needs), requirements-dev.lock adds the tools
on top of it, and each package is pinned once."""

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
    assert set(runtime) == _closure(project["dependencies"])
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
