"""Where a worker's memory goes (`python -m bench.memory --by-library`): the libraries a
worker of `serve` imports, what each costs, and what building and starting the sidecar adds.

A probe process starts a worker the way `toolauthz.server.worker_group.worker_main` does
(a fresh interpreter that imports the target's module and receives the settings the
parent validated, pickled; `build_sidecar`; the shared listeners) on the benchmark's
config and reports the modules it ended up with, in the order they were first imported,
and its RSS at each stage. Then, for every third-party library among them (the modules
of it the worker imported):

* `marginal`: the RSS it adds when a fresh interpreter imports the worker's libraries in
  the worker's order (what it costs beside the ones before it; the standard-library
  modules it is first to pull in, and their shared objects such as libssl, count for it);
* `last`: the RSS it adds when imported after every other library of the worker (what
  cutting it saves; 0 when another library imports it anyway, as pyseto does cryptography);
* `alone`: the RSS it adds to a fresh interpreter by itself (the standard library and the
  other libraries it pulls in included).

The marginal figures, the interpreter, toolauthz's own modules, the build and the
listeners add up to the probe's RSS when listening, within about 2 MiB (import order
moves a few pages between steps)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

from bench.servers import ROOT

# The worker's startup, as `worker_main` runs it (spawned: a fresh interpreter that unpickles
# its target from toolauthz.server.worker_group, and the settings), measured after each stage.
PROBE = """
import json, pickle, sys, tempfile, pathlib
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))
stages = {"interpreter": rss()}
import toolauthz.server.worker_group
from toolauthz.server.build import build_sidecar
from toolauthz.server.serving import start_listeners
from toolauthz.server.listeners import planned_listeners
stages["imports"] = rss()
settings = pickle.loads(bytes.fromhex(sys.argv[1]))
toolauthz.server.worker_group.configure_decision_log(settings.decision_log)
toolauthz.server.worker_group.configure_tracing(settings.tracing)
sidecar = build_sidecar(settings)
stages["sidecar built"] = rss()
sidecar.share_status(pathlib.Path(tempfile.mkdtemp()), 0)
serving = start_listeners(sidecar, planned_listeners(settings), reuse_port=True)
toolauthz.server.worker_group.keep_bundles_frozen(sidecar)
stages["listening"] = rss()
# Importable modules (not the pseudo-modules extensions register, such as cython_runtime).
names = [name for name, module in sys.modules.items() if getattr(module, "__spec__", None)]
print(json.dumps({"modules": names, "stages": stages}))
serving.stop(None)
sidecar.close()
"""

_RSS = """
import importlib, json, sys
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))
out, before = {}, rss()
for group, modules in json.loads(sys.argv[1]).items():
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:  # out of its package's order (a cycle): its package imports it itself
                pass
    out[group], before = rss() - before, rss()
print(json.dumps(out))
"""


def _python(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode:
        raise RuntimeError(f"probe failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe(config: str) -> dict:
    """The probe's report: {"modules": names in import order, "stages": RSS MiB}."""
    from toolauthz.server.config import load_settings

    settings = load_settings(config).model_copy(update={"generate_missing_keys": True})
    return _python(PROBE, pickle.dumps(settings).hex())


def libraries_of(modules: list[str]) -> dict[str, list[str]]:
    """The third-party libraries among `modules` (not the standard library, not ours), each
    with the modules of it the worker imported, in the worker's order: a library's extension
    often sits in a submodule (cryptography's is `cryptography.hazmat.bindings._rust`)."""
    ours = {"toolauthz", "bench", "__main__", "__mp_main__"}
    groups: dict[str, list[str]] = {}
    for name in modules:
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names or top in ours \
                or top.startswith(("_", "__editable__")):
            continue
        groups.setdefault(top, []).append(name)
    return groups


def breakdown(config: str) -> dict:
    """Per library (worker order) its marginal and alone MiB, and the probe's stages."""
    report = probe(config)
    libraries = libraries_of(report["modules"])
    marginal = _python(_RSS, json.dumps(libraries))
    own_modules = [name for name in report["modules"] if name.partition(".")[0] == "toolauthz"]
    ours = _python(_RSS, json.dumps({**libraries, "toolauthz": own_modules}))
    alone = {name: _python(_RSS, json.dumps({name: modules}))[name] for name, modules in libraries.items()}
    last = {name: _python(_RSS, json.dumps({"others": [m for other, ms in libraries.items() if other != name
                                                       for m in ms], name: modules}))[name]
            for name, modules in libraries.items()}
    rows = [{"library": name, "marginal_mib": round(marginal[name], 1), "last_mib": round(last[name], 1),
             "alone_mib": round(alone[name], 1)} for name in libraries]
    own = ours["toolauthz"]
    return {"libraries": rows, "toolauthz_mib": round(own, 1),
            "stages": {key: round(value, 1) for key, value in report["stages"].items()}}


def print_breakdown(out: dict, target: float) -> None:
    stages = out["stages"]
    print(f"{'library':28s} {'marginal':>9s} {'last':>6s} {'alone':>6s}  MiB")
    for row in sorted(out["libraries"], key=lambda r: (-r["marginal_mib"], -r["last_mib"])):
        if max(row["marginal_mib"], row["last_mib"]) >= 0.1 or row["alone_mib"] >= 1:
            print(f"{row['library']:28s} {row['marginal_mib']:9.1f} {row['last_mib']:6.1f} {row['alone_mib']:6.1f}")
    listed = sum(row["marginal_mib"] for row in out["libraries"])
    print(f"{'all libraries':28s} {listed:9.1f}")
    print(f"{'toolauthz modules':28s} {out['toolauthz_mib']:9.1f}")
    print(f"{'interpreter':28s} {stages['interpreter']:9.1f}")
    print(f"{'build_sidecar':28s} {stages['sidecar built'] - stages['imports']:9.1f}  (bundle, stores, keys)")
    print(f"{'listeners':28s} {stages['listening'] - stages['sidecar built']:9.1f}  (gRPC servers, threads)")
    print(f"{'probe worker, listening':28s} {stages['listening']:9.1f}  (target after load < {target} MiB)")
