"""Memory of `serve` (`python -m bench.memory`): the worker processes as an operator runs
them (`toolauthz.server.workers`, default settings, a bundle of `--policies`), measured from
/proc when they are ready and again after `--seconds` of Authorize at 32 calls in flight.

Reported per worker: RSS (resident pages, shared libraries included), its peak (VmHWM)
and PSS (shared pages divided among the processes that map them: what one more worker
costs); RSS split into anon (the process's own heap and objects) and libraries (the
pages of the shared objects it touched, clean and shared with the other workers); its
threads and open file descriptors (a leaked connection shows there first). Issue 31's
target is the RSS of one worker, under 90 MiB. The bundle does not move it: a worker of
the example bundle (policies/) is ready at the same RSS as one of the generated 10 policies.

`--by-library` first prints where a worker's memory goes: each library it imports, its
own modules, the bundle and stores, the listeners (bench/memory_libraries.py)."""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from bench import bundles, load, memory_libraries, servers

TARGET_RSS_MIB = 90


def _workers(supervisor: int) -> list[int]:
    """The worker processes: the supervisor's children that serve (not its resource
    tracker, which `multiprocessing` starts too); with one worker, the supervisor serves."""
    return [pid for pid in servers.children_of(supervisor)
            if "resource_tracker" not in pathlib.Path(f"/proc/{pid}/cmdline").read_text()] or [supervisor]


def memory_of(pid: int) -> dict[str, float]:
    """RSS, peak RSS and PSS of one process, in MiB."""
    status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    # The rollup's first line is the address range it sums; the others are `Name: value kB`.
    rollup = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])

    def mib(value: str) -> float:
        return round(int(value.split()[0]) / 1024, 1)

    # RssAnon: the process's own heap and objects; RssFile: the pages of its shared
    # libraries it touched (shared with the other workers, so its PSS counts a part).
    return {"rss_mib": mib(status["VmRSS"]), "peak_rss_mib": mib(status["VmHWM"]), "pss_mib": mib(rollup["Pss"]),
            "anon_mib": mib(status["RssAnon"]), "file_mib": mib(status["RssFile"]),
            "threads": int(status["Threads"]), "fds": len(list(pathlib.Path(f"/proc/{pid}/fd").iterdir()))}


def write_config(root: pathlib.Path, policies: int) -> pathlib.Path:
    """`serve`'s default settings with a generated bundle of `policies` and data in `root`."""
    bundle = bundles.generate_bundle(root / "bundle", policies)
    config = root / "serve.yaml"
    config.write_text(json.dumps({"bundle": str(bundle), "data_dir": str(root / "data"),
                                  "generate_missing_keys": True}))  # JSON is YAML
    return config


def measure(root: pathlib.Path, *, policies: int, workers: int, seconds: float) -> dict:
    config = write_config(root, policies)
    server = servers.start_workers(str(config), workers)
    try:
        pids = _workers(server.pid)
        ready = {pid: memory_of(pid) for pid in pids}
        result = load.closed_loop(server.address, rpc="authorize", concurrency=32, procs=2, duration=seconds,
                                  tools=bundles.tool_count(policies), prefix=f"mem{time.monotonic_ns() % 10**9}",
                                  max_calls=10**6)
        loaded = {pid: memory_of(pid) for pid in pids}
    finally:
        server.stop()
    return {"policies": policies, "workers": workers, "seconds": seconds,
            "calls": result.timed_ok, "errors": dict(result.errors),
            "ready": list(ready.values()), "after_load": list(loaded.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="as `serve` defaults to on two cores")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--by-library", action="store_true",
                        help="first, what each library a worker imports costs (bench/memory_libraries.py)")
    args = parser.parse_args(argv)
    by_library = None
    if args.by_library:
        with tempfile.TemporaryDirectory(prefix="toolauthz-memory-") as tmp:
            by_library = memory_libraries.breakdown(str(write_config(pathlib.Path(tmp), args.policies)))
        memory_libraries.print_breakdown(by_library, TARGET_RSS_MIB)
    with tempfile.TemporaryDirectory(prefix="toolauthz-memory-") as tmp:
        out = measure(pathlib.Path(tmp), policies=args.policies, workers=args.workers, seconds=args.seconds)
    for label in ("ready", "after_load"):
        for index, figures in enumerate(out[label]):
            print(f"worker {index} {label:10s} RSS {figures['rss_mib']:6.1f} MiB  peak {figures['peak_rss_mib']:6.1f}"
                  f"  PSS {figures['pss_mib']:6.1f}  (anon {figures['anon_mib']:5.1f},"
                  f" libraries {figures['file_mib']:5.1f}), {figures['threads']} threads, {figures['fds']} fds")
    worst = max(f["peak_rss_mib"] for f in out["after_load"])
    print(f"{out['calls']} calls; peak RSS of a worker {worst:.1f} MiB: "
          f"{'PASS' if worst < TARGET_RSS_MIB else 'FAIL'} (target < {TARGET_RSS_MIB} MiB)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({**out, "by_library": by_library}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
