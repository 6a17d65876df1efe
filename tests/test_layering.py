"""The import graph of toolauthz/ has no cycle and flows one way, down the layers below.

This file is where the layer order is written; docs/architecture.md draws the same
order. Every import counts: at module level, inside functions and under TYPE_CHECKING,
and `from package import module` is an import of that module.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "toolauthz"

# Low to high. A module may import modules of its own layer or of a lower one, never
# of a higher one. A module belongs to the layer whose prefix names it most closely,
# so `toolauthz.server.pump` sits below the rest of `toolauthz.server`.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # The packages identity/, usage/ and display/ hold modules of several layers; each
    # package's own __init__ imports nothing, so it sits at the bottom.
    ("core values", frozenset({"toolauthz.errors", "toolauthz.clock", "toolauthz.model", "toolauthz.strict_json",
                               "toolauthz.canonical", "toolauthz.digest", "toolauthz.display",
                               "toolauthz.files", "toolauthz.usage", "toolauthz.usage.charges",
                               "toolauthz.identity"})),
    # Metrics and spans: recorded by audit, store, authorizer, pump and service, so just
    # above the values; it imports no other sidecar module (the engine never records).
    ("telemetry", frozenset({"toolauthz.telemetry"})),
    # jwks: an identity provider's keys by `kid` and third-party JWTs checked against
    # them; used by approvers' ID tokens, the console sign-in and the MCP gateway.
    ("jwks", frozenset({"toolauthz.identity.jwks"})),
    ("bundle", frozenset({"toolauthz.bundle"})),
    # decided_by: which entities a decision was made on, as its audit record keeps them.
    # visibility: which tools a principal could ever be allowed (partial evaluation), for tool lists.
    ("engine", frozenset({"toolauthz.engine", "toolauthz.decided_by", "toolauthz.usage.metering",
                         "toolauthz.visibility"})),
    # oidc: approvers' ID tokens, verified like the sidecar's own tokens.
    ("tokens, audit", frozenset({"toolauthz.tokens", "toolauthz.audit", "toolauthz.identity.oidc"})),
    # Storage writes audit records in the ledger's own transaction, so it knows the
    # audit trail's records and chain; audit/ never knows storage.
    ("store", frozenset({"toolauthz.store"})),
    # approvers: who a deciding person is (ID tokens) and that they are of the tenant.
    ("approvals, authorizer", frozenset({"toolauthz.call_record", "toolauthz.approvals", "toolauthz.authorizer",
                                         "toolauthz.batch", "toolauthz.identity.approvers"})),
    # Approval notifications: events read from the store, sent off the decision path.
    ("notify", frozenset({"toolauthz.notify"})),
    # The decision pump runs the authorizer's plans on one thread; the gRPC handlers
    # hand their work to it, so it (and its queue) sits below the service although server/ holds it.
    ("decision pump", frozenset({"toolauthz.server.pump", "toolauthz.server.admission"})),
    ("service", frozenset({"toolauthz.service"})),
    # The browser console: pages over the approval desk and the audit log, served by
    # the server beside the gRPC and HTTP listeners.
    ("console", frozenset({"toolauthz.console"})),
    ("server", frozenset({"toolauthz.server"})),
    ("cli", frozenset({"toolauthz.cli"})),
)


@dataclass(frozen=True)
class Fence:
    """A package beside the layers: what it may import, and who may import it."""

    package: str
    may_import: frozenset[str]
    imported_by: frozenset[str]


FENCES: tuple[Fence, ...] = (
    # The SDK a runtime embeds: it must not load the policy engine, the bundle loader,
    # storage or the server. It verifies tokens offline, so it may use tokens.
    Fence("toolauthz.client",
          may_import=frozenset({"toolauthz.client", "toolauthz.errors", "toolauthz.model", "toolauthz.strict_json",
                                "toolauthz.digest", "toolauthz.display.escape", "toolauthz.files.tools",
                                "toolauthz.tokens", "toolauthz.proto", "toolauthz.identity.jwks", "toolauthz.clock"}),
          imported_by=frozenset({"toolauthz.cli", "toolauthz.mcp_proxy", "toolauthz.integrations"})),
    # Adapters for agent frameworks: runtimes like the MCP proxy, through the SDK only
    # (each framework is an optional extra; the package itself imports none of them).
    # The CLI's `hook claude-code` uses the Claude hook decision.
    Fence("toolauthz.integrations",
          may_import=frozenset({"toolauthz.integrations", "toolauthz.client", "toolauthz.proto"}),
          imported_by=frozenset({"toolauthz.cli"})),
    # The MCP proxy is a runtime like any other: it reaches the sidecar through the SDK
    # and reads the tool files itself, so it loads no engine, bundle loader or storage.
    # It checks bearer access tokens against its identity provider's keys (jwks), and
    # reports the root package's `__version__` (that __init__ imports nothing) as serverInfo.
    Fence("toolauthz.mcp_proxy",
          may_import=frozenset({"toolauthz", "toolauthz.mcp_proxy", "toolauthz.client", "toolauthz.errors",
                                "toolauthz.model",
                                "toolauthz.strict_json", "toolauthz.digest", "toolauthz.display.escape",
                                "toolauthz.files.tools", "toolauthz.proto", "toolauthz.identity.jwks",
                                "toolauthz.clock"}),
          imported_by=frozenset({"toolauthz.cli"})),
    # Adapters for agent frameworks: runtimes too, built on the SDK; the CLI may reach
    # them for the command hooks of coding agents.
    Fence("toolauthz.integrations",
          may_import=frozenset({"toolauthz.integrations", "toolauthz.client", "toolauthz.errors", "toolauthz.model",
                                "toolauthz.strict_json", "toolauthz.digest", "toolauthz.display.escape",
                                "toolauthz.clock", "toolauthz.proto"}),
          imported_by=frozenset({"toolauthz.cli"})),
    # Generated gRPC code: only the code that speaks gRPC touches it. The generated
    # modules themselves are not parsed (they import only each other).
    Fence("toolauthz.proto",
          may_import=frozenset({"toolauthz.proto"}),
          imported_by=frozenset({"toolauthz.client", "toolauthz.mcp_proxy", "toolauthz.service", "toolauthz.server",
                                 "toolauthz.cli", "toolauthz.integrations"})),
)

# Imports that break the rules today, each with the reason and the way out. An entry
# whose import is gone fails the test, so this list only ever shrinks.
EXCEPTIONS: dict[tuple[str, str], str] = {
}

# The root package's __init__ is empty: it belongs to no layer and imports nothing.
UNLAYERED = frozenset({"toolauthz"})


def module_name(path: pathlib.Path, top: pathlib.Path) -> str:
    parts = path.relative_to(top.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(top: pathlib.Path, skip: Iterable[str] = ("toolauthz.proto",)) -> dict[str, set[str]]:
    """Module -> the modules of `top`'s package it imports (every import statement,
    wherever it stands). The packages in `skip` are not parsed, only imported."""
    files = {module_name(p, top): p for p in sorted(top.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        if any(_under(name, s) for s in skip):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                # `from pkg import module` imports the module; `from pkg import Name`
                # imports pkg (its __init__).
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                               for alias in node.names)
        graph[name] = {t for t in targets if _under(t, top.name) and t != name}
    return graph


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[:len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _under_any(module: str, prefixes: Iterable[str]) -> bool:
    return any(_under(module, p) for p in prefixes)


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def layer_of(module: str, layers: tuple[tuple[str, frozenset[str]], ...]) -> int | None:
    """The index of the layer whose prefix names `module` most closely."""
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(layers)
               for prefix in prefixes if _under(module, prefix)]
    return max(matches)[1] if matches else None


def violations(graph: Mapping[str, Iterable[str]], layers: tuple[tuple[str, frozenset[str]], ...],
               fences: tuple[Fence, ...] = (), unlayered: frozenset[str] = frozenset()) -> list[str]:
    found = []
    for importer in sorted(graph):
        for target in sorted(graph[importer]):
            problem = _edge_problem(importer, target, layers, fences, unlayered)
            if problem:
                found.append(f"{importer} -> {target}: {problem}")
    return found


def _edge_problem(importer: str, target: str, layers: tuple[tuple[str, frozenset[str]], ...],
                  fences: tuple[Fence, ...], unlayered: frozenset[str]) -> str | None:
    fence_of = {f.package: f for f in fences}
    importer_fence = next((f for p, f in fence_of.items() if _under(importer, p)), None)
    target_fence = next((f for p, f in fence_of.items() if _under(target, p)), None)
    if target_fence is not None and target_fence is not importer_fence:
        if not _under_any(importer, target_fence.imported_by):
            return f"{target_fence.package} may be imported only by {sorted(target_fence.imported_by)}"
    if importer_fence is not None:
        if target_fence is not importer_fence and not _under_any(target, importer_fence.may_import):
            return f"{importer_fence.package} may import only {sorted(importer_fence.may_import)}"
        return None
    if target_fence is not None:
        return None
    importer_layer, target_layer = layer_of(importer, layers), layer_of(target, layers)
    for module, layer in ((importer, importer_layer), (target, target_layer)):
        if layer is None and module not in unlayered:
            return f"{module} is in no layer: add it to LAYERS"
    if importer_layer is not None and target_layer is not None and target_layer > importer_layer:
        return f"layer `{layers[importer_layer][0]}` imports the higher layer `{layers[target_layer][0]}`"
    return None


# --- the rules on toolauthz/ ---------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_imports_flow_down_the_layers(graph):
    found = violations(graph, LAYERS, FENCES, UNLAYERED)
    unexpected = [v for v in found if tuple(v.split(":")[0].split(" -> ")) not in EXCEPTIONS]
    assert unexpected == [], "\n".join(unexpected)


def test_every_exception_is_still_needed(graph):
    stale = [f"{a} -> {b}" for a, b in EXCEPTIONS if b not in graph.get(a, set())]
    assert stale == [], "no longer imported, remove from EXCEPTIONS: " + ", ".join(stale)


def test_the_graph_is_the_whole_package(graph):
    assert {"toolauthz.engine", "toolauthz.server.build", "toolauthz.client.guard", "toolauthz.cli.main"} <= set(graph)
    assert any(_under(target, "toolauthz.bundle") for target in graph["toolauthz.engine"])


# --- the checker itself --------------------------------------------------------------

def test_reads_every_kind_of_import(tmp_path):
    top = tmp_path / "pkg"
    (top / "sub").mkdir(parents=True)
    (top / "__init__.py").write_text("")
    (top / "sub" / "__init__.py").write_text("from .leaf import thing\n")
    (top / "sub" / "leaf.py").write_text("thing = 1\n")
    (top / "base.py").write_text("")
    (top / "other.py").write_text("")
    (top / "typed.py").write_text("")
    (top / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from pkg.sub import leaf\n"          # a module named in `from package import`
        "from pkg.sub import thing\n"         # a name: the package's __init__
        "from . import base\n"                # relative
        "if TYPE_CHECKING:\n"
        "    import pkg.typed\n"
        "def late():\n"
        "    import pkg.other\n")
    graph = import_graph(top, skip=())
    assert graph["pkg.top"] == {"pkg.sub.leaf", "pkg.sub", "pkg.base", "pkg.typed", "pkg.other"}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}


def test_names_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


SMALL_LAYERS = (("low", frozenset({"p.low"})), ("high", frozenset({"p.high"})), ("top", frozenset({"p.high.top"})))


def test_flags_an_upward_import():
    assert violations({"p.high.x": {"p.low"}, "p.low": set()}, SMALL_LAYERS) == []
    assert violations({"p.low": {"p.high.x"}}, SMALL_LAYERS) == [
        "p.low -> p.high.x: layer `low` imports the higher layer `high`"]
    # the closest prefix decides: p.high.top is above p.high
    assert violations({"p.high.x": {"p.high.top.y"}}, SMALL_LAYERS) == [
        "p.high.x -> p.high.top.y: layer `high` imports the higher layer `top`"]


def test_flags_a_module_in_no_layer():
    assert violations({"p.low": {"p.stray"}}, SMALL_LAYERS) == [
        "p.low -> p.stray: p.stray is in no layer: add it to LAYERS"]


def test_flags_crossing_a_fence():
    fence = Fence("p.client", may_import=frozenset({"p.client", "p.low"}), imported_by=frozenset({"p.high"}))
    assert violations({"p.client.a": {"p.low"}, "p.high": {"p.client"}}, SMALL_LAYERS, (fence,)) == []
    assert violations({"p.client.a": {"p.high"}, "p.low": {"p.client.a"}}, SMALL_LAYERS, (fence,)) == [
        "p.client.a -> p.high: p.client may import only ['p.client', 'p.low']",
        "p.low -> p.client.a: p.client may be imported only by ['p.high']"]
