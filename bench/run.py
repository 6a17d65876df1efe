"""toolauthz benchmark: decisions per second and latency, from the transport floor to
the full decision path, on this machine, in one run.

    .venv/bin/python -m bench                  # full run (about 5 minutes on 2 cores)
    .venv/bin/python -m bench --quick          # smoke run (seconds)
    .venv/bin/python -m bench --json out.json  # also write the results as JSON ('-': stdout)
    .venv/bin/python -m bench --compare base.json  # and each figure's ratio to a saved run
    .venv/bin/python -m bench --results out.json --markdown  # docs/performance.md's tables of a saved run

Measured (closed loop: N calls in flight from separate client processes):
  noop        a ToolAuthorizer servicer returning canned responses of realistic size
  sidecar     build_sidecar + create_server: validation, Cedar, ledger, token, audit commit
  mtls        the same sidecar behind an mTLS listener (client certificate verified, caller from
              its URI SAN), Authorize at the highest concurrency: what TLS costs
  Verify      tokens minted by Authorize before the timed phase, each verified once
  workers     `python -m toolauthz.server.workers --workers N` (SO_REUSEPORT), against N no-op servers
  in-process  Authorizer.authorize called directly, and engine.decide alone
  batch       AuthorizeBatch of 4 calls against 4 single Authorize calls, CPU per decision (bench/batch.py)
  open loop   Authorize at a fixed offered rate, latency from each call's due time, and at half
              of the server's own maximum (its closed-loop rate at the highest concurrency)
  hostile     (asked for by name) a 4 MB HTTP body's cost to the shared event loop, and gRPC
              Authorize p50/p99 quiet and while unauthenticated callers post such bodies
              (bench/hostile.py)
and then the audit trail of every sidecar is checked: one record per response.
Every load targets 127.0.0.1, is bounded in calls and seconds, and stops by itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import batch, bundles, hostile, inproc, load, pki, report, servers, stats
from toolauthz.server.config import DATABASE_FILE

PHASES = frozenset({"noop", "sidecar", "mtls", "workers", "inproc", "batch", "hostile"})
# `hostile` measures safety under attack, not speed: asked for by name (`--phases hostile`).
DEFAULT_PHASES = PHASES - {"hostile"}
# Issue 22's targets, ratios within one run (docs/performance.md), beside the standing goal.
GOAL_THROUGHPUT_RATIO = 0.5  # Authorize/s at the highest concurrency, two workers against two no-op processes
TARGET_THROUGHPUT_RATIO = 0.45  # the same, this round
TARGET_ADDED_P50_MS = {"authorize": 0.5, "verify": 0.3}  # p50 at one in flight minus the no-op's
TARGET_HALF_MAX_P99_RATIO = 5.0  # p99 at half the closed-loop maximum rate / p50 at one in flight
TARGET_COST_RATIO = 1.3  # Authorize cost at the largest bundle / at the smallest


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    concurrency: tuple[int, ...]
    duration: float  # seconds per closed-loop run
    client_procs: int  # client processes for the highest concurrency
    verify_tokens: dict  # concurrency -> tokens minted (= the most Verify calls timed)
    max_calls: int  # most calls per closed-loop run
    open_rate: float  # a fixed offered rate (1,000/s: the rate of the peers' published figures)
    open_duration: float
    open_procs: int
    open_sweep: tuple[float, ...]  # lower offered rates also measured: where the knee is
    workers: int
    inproc_calls: int
    profile_calls: int
    static_users: int = 10000  # in-process also at the middle size with that many more static entities
    mode: str = "full"


FULL = Plan(sizes=(10, 1000, 10000), concurrency=(1, 32), duration=5.0, client_procs=2,
            verify_tokens={1: 1500, 32: 5000}, max_calls=40000, open_rate=1000.0, open_duration=10.0, open_procs=1,
            open_sweep=(200.0, 400.0), workers=2, inproc_calls=1000, profile_calls=2000)
QUICK = Plan(sizes=(10, 40), concurrency=(1, 4), duration=0.2, client_procs=1, verify_tokens={1: 20, 4: 40},
             max_calls=2000, open_rate=100.0, open_duration=0.3, open_procs=1, open_sweep=(), workers=2,
             inproc_calls=30, profile_calls=30, static_users=200, mode="quick")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Results:
    date: str
    machine: dict
    plan: dict
    runs: list = field(default_factory=list)
    open_loop: list = field(default_factory=list)
    audit: list = field(default_factory=list)
    inproc: list = field(default_factory=list)
    startup: list = field(default_factory=list)
    profile: dict | None = None
    batch: dict | None = None
    hostile: dict | None = None
    targets: list = field(default_factory=list)

    def find(self, **match) -> dict | None:
        return next((r for r in self.runs if all(r.get(k) == v for k, v in match.items())), None)


class Bench:
    def __init__(self, plan: Plan, root: pathlib.Path):
        self.plan, self.root = plan, root
        self.default_size = plan.sizes[len(plan.sizes) // 2]
        self.results = Results(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                               machine={**stats.machine(), "data_filesystem": stats.filesystem(str(root))},
                               plan=asdict(plan))
        self.bundles: dict[int, pathlib.Path] = {}

    # -- helpers -------------------------------------------------------------------------

    def _procs_for(self, concurrency: int) -> int:
        return 1 if concurrency == 1 else min(self.plan.client_procs, concurrency)

    def _closed(self, server: servers.RunningServer, *, label: str, rpc: str, concurrency: int, policies,
                workers: int, responses: dict | None = None, cpu=None, tls: dict | None = None) -> dict:
        tools = bundles.tool_count(policies or self.default_size)
        max_calls = self.plan.verify_tokens.get(concurrency, self.plan.max_calls) if rpc == "verify" \
            else self.plan.max_calls
        # How many calls shared a batch (and so a commit): one process only, as GetStatus
        # answers for the worker it reaches.
        pump_before = servers.pump_counts(server.address) if label == "sidecar" and workers == 1 else None
        result = load.closed_loop(server.address, rpc=rpc, concurrency=concurrency,
                                  procs=self._procs_for(concurrency), duration=self.plan.duration, tools=tools,
                                  prefix=f"{label.replace(' ', '')}{concurrency}{rpc[0]}{time.monotonic_ns() % 10**6}",
                                  max_calls=max_calls, cpu=cpu or server.cpu_seconds, tls=tls)
        if responses is not None:
            for kind, ids in result.decision_ids.items():
                responses.setdefault(kind, []).extend(ids)
        row = {"server": label, "rpc": rpc, "policies": policies, "workers": workers, "concurrency": concurrency,
               "client_procs": self._procs_for(concurrency), "seconds": round(result.seconds, 3),
               "calls": result.timed_ok, "throughput_per_s": result.timed_ok / result.seconds,
               "server_cpu_ms_per_call": result.server_cpu_seconds * 1e3 / max(result.timed_ok, 1),
               **stats.latency_summary(result.latencies_ns), "errors": dict(result.errors)}
        if pump_before is not None:
            pump_after = servers.pump_counts(server.address)
            decisions, batches = (now - then for now, then in zip(pump_after, pump_before, strict=True))
            row["calls_per_batch"] = decisions / max(batches, 1)
        self.results.runs.append(row)
        log(f"{label:8s} {rpc:9s} policies={policies} workers={workers} c={concurrency}: "
            f"{row['throughput_per_s']:.0f}/s p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms "
            f"server CPU {row['server_cpu_ms_per_call']:.2f} ms/call"
            + (f", {row['calls_per_batch']:.1f} calls/batch" if "calls_per_batch" in row else "")
            + (f" errors {row['errors']}" if row["errors"] else ""))
        return row

    def _open_all(self, server: servers.RunningServer, *, policies: int, workers: int, responses: dict) -> None:
        for rate in sorted({*self.plan.open_sweep, self.plan.open_rate}):
            self._open(server, rate=rate, policies=policies, workers=workers, responses=responses)
        # Half of this server's own maximum: its closed-loop rate at the highest concurrency, just measured.
        top = self.results.find(server="sidecar", rpc="authorize", policies=policies, workers=workers,
                                concurrency=max(self.plan.concurrency))
        if top and top["throughput_per_s"] > 0:
            self._open(server, rate=round(top["throughput_per_s"] / 2, 1), policies=policies, workers=workers,
                       responses=responses, half_max=True)

    def _open(self, server: servers.RunningServer, *, rate: float, policies: int | None, workers: int,
              responses: dict, label: str = "sidecar", half_max: bool = False) -> dict:
        plan = self.plan
        result = load.open_loop(server.address, rate=rate, duration=plan.open_duration,
                                procs=plan.open_procs, tools=bundles.tool_count(policies or self.default_size),
                                prefix=f"open{workers}w{time.monotonic_ns() % 10**6}", cpu=server.cpu_seconds)
        for kind, ids in result.decision_ids.items():
            responses.setdefault(kind, []).extend(ids)
        errors = sum(result.errors.values())
        row = {"server": label, "policies": policies, "workers": workers, "offered_per_s": rate,
               "half_max": half_max,
               "seconds": plan.open_duration, "sent": result.sent,
               "achieved_send_per_s": result.sent / max(result.send_end - result.start, 1e-9),
               "completed_per_s": result.timed_ok / max(result.end - result.start, 1e-9),
               **stats.latency_summary(result.latencies_ns), "errors": dict(result.errors),
               "failed_calls": errors, "server_cpu_share": result.server_cpu_seconds / max(result.seconds, 1e-9)}
        self.results.open_loop.append(row)
        log(f"open loop {label} @{rate:.0f}/s{' (half max)' if half_max else ''} workers={workers}: "
            f"completed {row['completed_per_s']:.0f}/s "
            f"p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} p99.9 {row['p999_ms']:.2f} ms"
            + (f" errors {row['errors']}" if errors else ""))
        return row

    def _settings(self, size: int, name: str) -> dict:
        return {"bundle": str(self.bundles[size]), "data_dir": str(self.root / f"data-{name}"),
                "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}}

    def _audit(self, label: str, settings: dict, responses: dict) -> None:
        check = stats.audit_check(str(pathlib.Path(settings["data_dir"]) / DATABASE_FILE), responses)
        self.results.audit.append({"server": label, **check})
        log(f"audit {label}: {'ok' if check['ok'] else 'MISMATCH'} "
            f"(authorize {check['authorize']['records']}/{check['authorize']['responses']}, "
            f"verify {check['verify']['records']}/{check['verify']['responses']})")

    # -- phases ----------------------------------------------------------------------------

    def generate(self) -> None:
        for size in self.plan.sizes:
            self.bundles[size] = bundles.generate_bundle(self.root / f"bundle-{size}", size)
        log(f"bundles: {', '.join(f'{s} policies / {bundles.tool_count(s)} tools' for s in self.plan.sizes)}")

    def noop(self) -> None:
        server = servers.start_noop()
        try:
            for rpc in ("authorize", "verify"):
                for c in self.plan.concurrency:
                    self._closed(server, label="noop", rpc=rpc, concurrency=c, policies=None, workers=1)
            self._open(server, rate=self.plan.open_rate, policies=None, workers=1, responses={}, label="noop")
        finally:
            server.stop()

    def sidecar(self, size: int) -> None:
        settings = self._settings(size, f"sidecar-{size}")
        began = time.perf_counter()
        server = servers.start_sidecar(settings)
        self.results.startup.append({"server": "sidecar", "policies": size, "workers": 1,
                                     "seconds": time.perf_counter() - began})
        responses: dict = {}
        try:
            for c in self.plan.concurrency:
                self._closed(server, label="sidecar", rpc="authorize", concurrency=c, policies=size, workers=1,
                             responses=responses)
            if size == self.default_size:
                for c in self.plan.concurrency:
                    self._closed(server, label="sidecar", rpc="verify", concurrency=c, policies=size, workers=1,
                                 responses=responses)
                self._open_all(server, policies=size, workers=1, responses=responses)
        finally:
            server.stop()
        self._audit(f"sidecar, {size} policies, 1 worker", settings, responses)

    def mtls(self) -> None:
        """The one-process sidecar behind an mTLS listener, beside the plaintext row of
        the same size and concurrency."""
        size, concurrency = self.default_size, max(self.plan.concurrency)
        files = pki.make_pki(self.root / "pki")
        settings = self._settings(size, "mtls")
        del settings["listen"]  # `listeners` replaces it
        settings["listeners"] = [{"address": f"{servers.HOST}:0", "services": ["authorizer"],
                                  "tls": {"cert": files["server_cert"], "key": files["server_key"],
                                          "client_ca": files["ca"]}}]
        server = servers.start_sidecar(settings)
        responses: dict = {}
        try:
            self._closed(server, label="mtls", rpc="authorize", concurrency=concurrency, policies=size, workers=1,
                         responses=responses,
                         tls={"ca": files["ca"], "cert": files["client_cert"], "key": files["client_key"]})
        finally:
            server.stop()
        self._audit(f"mtls, {size} policies, 1 worker", settings, responses)

    def workers(self) -> None:
        n, size = self.plan.workers, self.default_size
        group = servers.start_noop_group(n)
        try:
            self._closed(group[0], label="noop", rpc="authorize", concurrency=max(self.plan.concurrency),
                         policies=None, workers=n, cpu=lambda: sum(s.cpu_seconds() for s in group))
        finally:
            for server in group:
                server.stop()
        settings = self._settings(size, f"workers-{n}")
        config = self.root / f"workers-{n}.yaml"
        config.write_text(json.dumps({**settings, "generate_missing_keys": True}))  # JSON is YAML
        began = time.perf_counter()
        server = servers.start_workers(str(config), n)
        self.results.startup.append({"server": "sidecar", "policies": size, "workers": n,
                                     "seconds": time.perf_counter() - began})
        responses: dict = {}
        try:
            for c in self.plan.concurrency:
                self._closed(server, label="sidecar", rpc="authorize", concurrency=c, policies=size, workers=n,
                             responses=responses)
            self._closed(server, label="sidecar", rpc="verify", concurrency=max(self.plan.concurrency),
                         policies=size, workers=n, responses=responses)
            self._open_all(server, policies=size, workers=n, responses=responses)
        finally:
            server.stop()
        self._audit(f"sidecar, {size} policies, {n} workers", settings, responses)

    def in_process(self, profile: bool) -> None:
        threads = [1, max(self.plan.concurrency)]
        runs = [(size, 0, self.bundles[size]) for size in self.plan.sizes]
        if self.plan.static_users:  # the cost must not grow with entities.json either
            size, extra = self.default_size, self.plan.static_users
            runs.append((size, extra, bundles.generate_bundle(self.root / f"bundle-{size}-users", size, extra)))
        for size, extra, bundle in runs:
            with_profile = profile and size == self.default_size and not extra
            out = inproc.run_inproc(bundle, tools=bundles.tool_count(size), calls=self.plan.inproc_calls,
                                    threads=threads, profile=with_profile, profile_calls=self.plan.profile_calls,
                                    data_root=str(self.root))
            row = {"policies": size, "static_users": extra, "decision": out["decision"],
                   "decide": {**stats.latency_summary(out["decide"]["lat"]),
                              "cpu_ms_per_call": out["decide"]["cpu_ms_per_call"]}}
            for t, v in out["authorizer"].items():
                row[f"authorizer_{t}"] = {**stats.latency_summary(v["lat"]), "cpu_ms_per_call": v["cpu_ms_per_call"],
                                          "threads": t, "throughput_per_s": len(v["lat"]) / v["seconds"]}
            rows = out["audit_rows"].get("authorize", 0)
            row["audit"] = {"authorize_calls": out["authorize_calls"], "records": rows,
                            "ok": rows == out["authorize_calls"]}
            self.results.inproc.append(row)
            if with_profile:
                self.results.profile = {"policies": size, **out["profile"]}
            users = f" + {extra} static users" if extra else ""
            log(f"in-process {size} policies{users}: decide p50 {row['decide']['p50_ms'] * 1000:.0f} us, authorizer "
                f"p50 {row['authorizer_1']['p50_ms']:.2f} ms, {threads[-1]} in flight through the pump "
                f"{row[f'authorizer_{threads[-1]}']['throughput_per_s']:.0f}/s")

    # -- verdicts ----------------------------------------------------------------------------

    def targets(self) -> None:
        """Issue 22's targets (docs/performance.md), each a ratio or a difference within this run."""
        r, plan, c, size = self.results, self.plan, max(self.plan.concurrency), self.default_size
        targets = []

        def add(name: str, value: float, limit: float, op: str, detail: str, extra_ok: bool = True) -> None:
            ok = (value >= limit if op == ">=" else value <= limit) and extra_ok and not math.isnan(value)
            targets.append({"target": name, "value": value, "limit": limit, "op": op, "pass": ok, "detail": detail})

        many = plan.workers
        noop_many = r.find(server="noop", rpc="authorize", concurrency=c, workers=many)
        auth_many = r.find(server="sidecar", rpc="authorize", concurrency=c, workers=many, policies=size)
        if noop_many and auth_many:
            ratio = auth_many["throughput_per_s"] / noop_many["throughput_per_s"]
            detail = f"{auth_many['throughput_per_s']:.0f}/s vs {noop_many['throughput_per_s']:.0f}/s ({size} policies)"
            name = f"Authorize/no-op throughput, {c} in flight, {many} workers vs {many} no-op processes"
            add(name, ratio, TARGET_THROUGHPUT_RATIO, ">=", detail)
            add(f"{name} (standing goal)", ratio, GOAL_THROUGHPUT_RATIO, ">=", detail)
        for rpc, limit in TARGET_ADDED_P50_MS.items():
            noop_one = r.find(server="noop", rpc=rpc, concurrency=1, workers=1)
            one = r.find(server="sidecar", rpc=rpc, concurrency=1, workers=1, policies=size)
            if noop_one and one:
                add(f"{rpc.capitalize()} p50 minus the no-op's, 1 in flight, 1 process (ms)",
                    one["p50_ms"] - noop_one["p50_ms"], limit, "<=",
                    f"p50 {one['p50_ms']:.2f} ms vs {noop_one['p50_ms']:.2f} ms ({size} policies)")
        for row in (o for o in r.open_loop if o.get("half_max")):
            one = r.find(server="sidecar", rpc="authorize", concurrency=1, workers=row["workers"],
                         policies=row["policies"])
            if one:
                complete = not row["failed_calls"] and row["completed_per_s"] >= 0.95 * row["offered_per_s"]
                add(f"Authorize p99 at half the maximum rate / p50 at 1 in flight, {row['workers']} worker(s)",
                    row["p99_ms"] / one["p50_ms"], TARGET_HALF_MAX_P99_RATIO, "<=",
                    f"p99 {row['p99_ms']:.2f} ms at {row['offered_per_s']:.0f}/s offered, completed "
                    f"{row['completed_per_s']:.0f}/s, {row['failed_calls']} failed; p50 {one['p50_ms']:.2f} ms",
                    extra_ok=complete)
        lo, hi = min(plan.sizes), max(plan.sizes)
        small = r.find(server="sidecar", rpc="authorize", concurrency=c, workers=1, policies=lo)
        large = r.find(server="sidecar", rpc="authorize", concurrency=c, workers=1, policies=hi)
        if small and large:
            add(f"Authorize cost at {hi} / at {lo} policies", small["throughput_per_s"] / large["throughput_per_s"],
                TARGET_COST_RATIO, "<=", f"1/throughput at {c} in flight: {1e3 / large['throughput_per_s']:.2f} ms "
                f"vs {1e3 / small['throughput_per_s']:.2f} ms")
        if r.audit:
            lost = sum(a[k]["missing"] for a in r.audit for k in ("authorize", "verify"))
            extra = sum(a[k]["extra"] for a in r.audit for k in ("authorize", "verify"))
            add("audit records lost (one record per response)", lost, 0, "<=",
                f"{sum(a[k]['records'] for a in r.audit for k in ('authorize', 'verify'))} records checked, "
                f"{extra} without a response", extra_ok=all(a["ok"] for a in r.audit))
        r.targets = targets

    def run(self, profile: bool, phases: frozenset[str] = DEFAULT_PHASES) -> Results:
        self.generate()
        if "noop" in phases:
            self.noop()
        if "sidecar" in phases:
            for size in self.plan.sizes:
                self.sidecar(size)
        if "mtls" in phases:
            self.mtls()
        if "workers" in phases and self.plan.workers > 1:
            self.workers()
        if "inproc" in phases:
            self.in_process(profile)
        if "batch" in phases:
            turns = 300 if self.plan.mode == "full" else 5
            self.results.batch = {"policies": self.default_size, **batch.run_batch(
                self.bundles[self.default_size], tools=bundles.tool_count(self.default_size), turns=turns,
                data_root=str(self.root))}
        if "hostile" in phases:
            full = self.plan.mode == "full"
            self.results.hostile = hostile.run_hostile(str(self.root), duration=3.0 if full else 0.3,
                                                       repeats=5 if full else 1, baseline=full)
            for row in self.results.hostile["loop_cost"]:
                log(f"hostile {row['case']}: HTTP {row['status']}, read {row['bytes_read']} bytes, "
                    f"loop stall {row['loop_stall_ms']:.1f} ms")
            for row in self.results.hostile["under_fire"]:
                log(f"hostile Authorize {row['phase']}: p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} ms")
        self.targets()
        return self.results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="write the results as JSON to PATH ('-' or no PATH: stdout, the table then goes "
                             "to stderr)")
    parser.add_argument("--sizes", help="policy counts, comma-separated (default 10,1000,10000)")
    parser.add_argument("--duration", type=float, help="seconds per closed-loop run (default 5)")
    parser.add_argument("--client-procs", type=int, help="client processes at the highest concurrency (default 2)")
    parser.add_argument("--open-rate", type=float, help="offered Authorize rate of the open-loop run (default 1000)")
    parser.add_argument("--open-duration", type=float, help="seconds of each open-loop run (default 10)")
    parser.add_argument("--open-sweep", help="lower offered rates to measure too, comma-separated (default 200,400)")
    parser.add_argument("--workers", type=int, help="worker processes to compare with one (default 2; 1: skip)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile of the decision path")
    parser.add_argument("--phases", default=",".join(sorted(DEFAULT_PHASES)),
                        help="what to run, comma-separated, from: " + ", ".join(sorted(PHASES))
                        + " (default: all but hostile)")
    parser.add_argument("--data-root", help="where the temporary bundles and data dirs go (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--compare", metavar="BASE.json",
                        help="also print each figure's ratio to the same figure of a run saved with --json")
    parser.add_argument("--results", metavar="RUN.json",
                        help="measure nothing: print a run saved with --json (with --compare, --markdown)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables of docs/performance.md instead of the plain table")
    parser.add_argument("--store", metavar="POSTGRESQL_URL",
                        help="also compare SQLite with one and three replicas on this PostgreSQL database "
                             "(Authorize at 32 in flight; a schema of its own, dropped afterwards)")
    args = parser.parse_args(argv)

    base = json.loads(pathlib.Path(args.compare).read_text()) if args.compare else None
    if args.results:
        saved = json.loads(pathlib.Path(args.results).read_text())
        print(report.markdown(saved) if args.markdown else report.render(saved))
        if base is not None:
            print("\n" + report.compare(base, saved))
        return 0
    phases = frozenset(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases <= PHASES:
        parser.error(f"unknown phase(s): {', '.join(sorted(phases - PHASES))}")
    plan = QUICK if args.quick else FULL
    overrides = {"sizes": tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None,
                 "duration": args.duration, "client_procs": args.client_procs, "open_rate": args.open_rate,
                 "open_duration": args.open_duration, "workers": args.workers,
                 "open_sweep": tuple(float(r) for r in args.open_sweep.split(",") if r) if args.open_sweep is not None
                 else None}
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    root = pathlib.Path(tempfile.mkdtemp(prefix="toolauthz-bench-", dir=args.data_root))
    log(f"{plan.mode} run in {root}")
    try:
        bench = Bench(plan, root)
        results = bench.run(profile=not args.no_profile, phases=phases)
        if args.store:
            from bench import stores

            if not bench.bundles:
                bench.generate()
            stores.compare(bench, args.store)
    finally:
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    saved = asdict(results)
    table = report.markdown(saved) if args.markdown else report.render(saved)
    if base is not None:
        table += "\n\n" + report.compare(base, saved)
    to_stdout = args.json == "-"
    print(table, file=sys.stderr if to_stdout else sys.stdout, flush=True)
    if args.json:
        text = json.dumps(saved, indent=2, default=str)
        if to_stdout:
            print(text)
        else:
            pathlib.Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
