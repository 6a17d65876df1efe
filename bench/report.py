"""What a run measured, as text: the table `python -m bench` prints, the ratios of each
figure to a saved run (`--compare BASE.json`), and the tables of docs/performance.md
(`--markdown`). Everything here reads the results as saved by `--json` (plain dicts), so
a saved run can be printed again (`--results RUN.json`) without measuring anything."""

from __future__ import annotations

import json
import math

from bench import batch


def _count(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _f(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _offered(row: dict) -> str:
    """An open-loop run's offered rate; `*` marks half the server's closed-loop maximum."""
    return f"{row['offered_per_s']:.0f}" + ("*" if row.get("half_max") else "")


def render(results: dict) -> str:
    m, date, mode = results["machine"], results["date"], results["plan"]["mode"]
    lines = [f"toolauthz benchmark, {date} ({mode}): {m['nproc']} cores {m['cpu_model']}, "
             f"Python {m['python']}, grpcio {m['versions'].get('grpcio', '?')}, data on {m['data_filesystem'] or '?'}",
             "", "closed loop (decisions/s over the timed phase; latency per call and server CPU per call, ms)",
             f"{'server':8} {'rpc':9} {'policies':>8} {'workers':>7} {'in flight':>9} {'calls':>7} "
             f"{'per s':>8} {'p50':>7} {'p99':>8} {'p99.9':>8} {'srv CPU/call':>12} {'per batch':>9}  errors"]
    for r in results["runs"]:
        per_batch = _f(r["calls_per_batch"], 1) if "calls_per_batch" in r else "-"
        lines.append(f"{r['server']:8} {r['rpc']:9} {_f(r['policies']):>8} {r['workers']:>7} {r['concurrency']:>9} "
                     f"{r['calls']:>7} {r['throughput_per_s']:>8.0f} {_f(r['p50_ms']):>7} {_f(r['p99_ms']):>8} "
                     f"{_f(r['p999_ms']):>8} {_f(r['server_cpu_ms_per_call']):>12} {per_batch:>9}  "
                     f"{json.dumps(r['errors']) if r['errors'] else '-'}")
    if results["open_loop"]:
        lines += ["", "open loop Authorize (latency from each call's due time, ms; server CPU in cores and ms per "
                  "answered call)",
                  f"{'server':8} {'policies':>8} {'workers':>7} {'offered/s':>9} {'sent/s':>8} {'done/s':>8} "
                  f"{'p50':>7} {'p99':>8} {'p99.9':>8} {'max':>8} {'srv cores':>9} {'ms/call':>7}  errors"]
        for o in results["open_loop"]:
            per_call = o["server_cpu_share"] / max(o["completed_per_s"], 1e-9) * 1e3
            lines.append(f"{o['server']:8} {_f(o['policies']):>8} {o['workers']:>7} {_offered(o):>9} "
                         f"{o['achieved_send_per_s']:>8.0f} {o['completed_per_s']:>8.0f} {_f(o['p50_ms']):>7} "
                         f"{_f(o['p99_ms']):>8} {_f(o['p999_ms']):>8} {_f(o['max_ms']):>8} "
                         f"{_f(o['server_cpu_share']):>9} {_f(per_call):>7}  "
                         f"{json.dumps(o['errors']) if o['errors'] else '-'}")
    if results["inproc"]:
        t = max(results["plan"]["concurrency"])
        lines += ["", "in process, no gRPC (engine.decide alone; Authorizer.authorize with ledger, token, audit; "
                  "CPU per call of the whole process)",
                  f"{'policies':>8} {'decide p50 us':>13} {'CPU us':>7} {'authorize p50 ms':>16} {'p99 ms':>7} "
                  f"{'per s':>7} {'CPU ms':>7} {f'{t} in flight per s':>18} {'p99 ms':>8} {'CPU ms':>7}"]
        for row in results["inproc"]:
            a1, an, d = row["authorizer_1"], row[f"authorizer_{t}"], row["decide"]
            size = f"{row['policies']}+{_count(row['static_users'])}u" if row.get("static_users") else row["policies"]
            lines.append(f"{size:>8} {d['p50_ms'] * 1000:>13.0f} {d['cpu_ms_per_call'] * 1000:>7.0f} "
                         f"{a1['p50_ms']:>16.2f} {a1['p99_ms']:>7.2f} {a1['throughput_per_s']:>7.0f} "
                         f"{a1['cpu_ms_per_call']:>7.2f} {an['throughput_per_s']:>18.0f} {an['p99_ms']:>8.2f} "
                         f"{an['cpu_ms_per_call']:>7.2f}")
    if results.get("batch"):
        lines += ["", *batch.render(results["batch"], results["batch"]["policies"])]
    if results["startup"]:
        lines += ["", "startup (process start to serving): " + ", ".join(
            f"{s['policies']} policies / {s['workers']} worker(s) {s['seconds']:.1f} s" for s in results["startup"])]
    if results["audit"]:
        lines += ["", "audit check (decision ids of successful responses vs audit records)"]
        for a in results["audit"]:
            lines.append(f"  {a['server']}: authorize {a['authorize']['records']} records / "
                         f"{a['authorize']['responses']} responses, verify {a['verify']['records']} / "
                         f"{a['verify']['responses']}, missing {a['authorize']['missing'] + a['verify']['missing']}, "
                         f"extra {a['authorize']['extra'] + a['verify']['extra']}: {'OK' if a['ok'] else 'MISMATCH'}")
    if results["profile"]:
        p = results["profile"]
        lines += ["", f"where the time goes: cProfile of the gRPC handler called directly, {p['calls']} calls, "
                      f"{p['policies']} policies (us per call; profiler overhead included; nested rows indented)"]
        for s in p["stages"]:
            lines.append(f"  {s['stage']:42} {s['us_per_call']:>8.0f}")
        sc = p.get("stage_cpu")
        if sc:
            lines += ["", f"the same path timed without a profiler: CPU of the calling thread per step (us per call; "
                          f"{sc['calls']} calls; the whole process used {sc['process_cpu_us']:.0f} us per call)"]
            for s in sc["stages"]:
                lines.append(f"  {s['stage']:46} {s['cpu_us']:>8.0f}   (wall {_f(s['wall_us'], 0)})")
        w = p.get("writer") or {}
        if w:
            lines.append("  one audit commit (chain, insert, fsync): "
                         f"{w['batch_1_ms_per_commit']:.2f} ms for 1 record, "
                         f"{w['batch_32_ms_per_commit']:.2f} ms for 32")
    if results["targets"]:
        lines += ["", "targets"]
        for t in results["targets"]:
            lines.append(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {_f(t['value'])} {t['op']} "
                         f"{_f(t['limit'])}  ({t['detail']})")
    return "\n".join(lines)




# -- one figure per name: what --compare matches between two runs ------------------------

def _size(policies) -> str:
    return "-" if policies is None else f"{policies} policies"


def _open_key(row: dict) -> str:
    rate = "half the maximum" if row.get("half_max") else f"{row['offered_per_s']:.0f}/s"
    return f"open loop {row['server']}, {_size(row['policies'])}, {row['workers']}w, {rate}"


def figures(results: dict) -> dict[str, float]:
    """Every figure of a run by a name that is the same in every run of the same plan."""
    out: dict[str, float] = {}
    for r in results.get("runs", []):
        key = f"{r['server']} {r['rpc']}, {_size(r['policies'])}, {r['workers']}w, {r['concurrency']} in flight"
        out[f"{key}: per s"] = r["throughput_per_s"]
        out[f"{key}: p50 ms"] = r["p50_ms"]
        out[f"{key}: p99 ms"] = r["p99_ms"]
        out[f"{key}: server CPU ms/call"] = r["server_cpu_ms_per_call"]
    for o in results.get("open_loop", []):
        key = _open_key(o)
        out[f"{key}: done/s"] = o["completed_per_s"]
        out[f"{key}: p50 ms"] = o["p50_ms"]
        out[f"{key}: p99 ms"] = o["p99_ms"]
    t = max(results["plan"]["concurrency"])
    for row in results.get("inproc", []):
        key = f"in process, {row['policies']} policies" + (f" + {row['static_users']} users" if row.get("static_users")
                                                           else "")
        out[f"{key}: decide p50 us"] = row["decide"]["p50_ms"] * 1000
        out[f"{key}: authorize 1 in flight CPU ms/call"] = row["authorizer_1"]["cpu_ms_per_call"]
        out[f"{key}: authorize {t} in flight per s"] = row[f"authorizer_{t}"]["throughput_per_s"]
        out[f"{key}: authorize {t} in flight CPU ms/call"] = row[f"authorizer_{t}"]["cpu_ms_per_call"]
    for target in results.get("targets", []):
        out[f"target: {target['target']}"] = target["value"]
    return out


def compare(base: dict, now: dict) -> str:
    """Each figure of `now` beside the same figure of `base`, and their ratio."""
    before, after = figures(base), figures(now)
    common = [name for name in after if name in before]
    width = max((len(name) for name in common), default=10)
    lines = [f"compared with the run of {base['date']} ({base['plan']['mode']}): now / base",
             f"  {'figure':{width}} {'base':>10} {'now':>10} {'now/base':>8}"]
    for name in common:
        b, n = before[name], after[name]
        ratio = n / b if b and not (math.isnan(b) or math.isnan(n)) else float("nan")
        lines.append(f"  {name:{width}} {_f(float(b)):>10} {_f(float(n)):>10} {_f(ratio):>8}")
    missing = len(before) - len(common) + len(after) - len(common)
    if missing:
        lines.append(f"  ({missing} figures are in one run only)")
    return "\n".join(lines)


# -- the tables of docs/performance.md ------------------------------------------------------

def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _noop_of(results: dict, row: dict) -> dict | None:
    return next((r for r in results["runs"] if r["server"] == "noop" and r["rpc"] == row["rpc"]
                 and r["workers"] == row["workers"] and r["concurrency"] == row["concurrency"]), None)


def markdown(results: dict) -> str:
    """One table per question, as docs/performance.md shows them."""
    m, top = results["machine"], max(results["plan"]["concurrency"])
    lines = [f"Measured {results['date']} ({results['plan']['mode']} run): {m['nproc']} cores {m['cpu_model']}, "
             f"Python {m['python']}, grpcio {m['versions'].get('grpcio', '?')}, data on "
             f"{m['data_filesystem'] or '?'}.", "", "**Targets**", ""]
    lines += _table(["target", "measured", "limit", "", "detail"], [
        [t["target"], _f(t["value"]), f"{t['op']} {_f(t['limit'])}", "**PASS**" if t["pass"] else "**FAIL**",
         t["detail"]] for t in results["targets"]])

    def closed(concurrency: int, added: bool) -> list[list[str]]:
        rows = []
        for r in (r for r in results["runs"] if r["concurrency"] == concurrency):
            noop = _noop_of(results, r)
            versus = (f"{r['p50_ms'] - noop['p50_ms']:+.2f}" if added else
                      f"{r['throughput_per_s'] / noop['throughput_per_s']:.2f}") if noop and noop is not r else "-"
            rows.append([r["server"], r["rpc"], _f(r["policies"]), str(r["workers"]),
                         f"{r['throughput_per_s']:.0f}", versus, _f(r["p50_ms"]), _f(r["p99_ms"]),
                         _f(r["server_cpu_ms_per_call"]), _f(r.get("calls_per_batch"), 1)])
        return rows

    head = ["server", "rpc", "policies", "workers", "per s"]
    tail = ["p50 ms", "p99 ms", "server CPU ms/call", "calls per batch"]
    lines += ["", f"**Throughput at {top} in flight** (x no-op: against the no-op server with as many processes)", ""]
    lines += _table([*head, "x no-op", *tail], closed(top, added=False))
    lines += ["", "**Latency at one call in flight** (added: p50 minus the no-op's)", ""]
    lines += _table([*head, "added p50 ms", *tail], closed(1, added=True))
    lines += ["", "**Latency at a fixed offered rate** (Authorize; from each call's due time; `*`: half the "
              "server's maximum, its closed-loop rate at the highest concurrency)", ""]
    lines += _table(["server", "policies", "workers", "offered/s", "done/s", "p50 ms", "p99 ms", "p99.9 ms",
                     "failed calls"],
                    [[o["server"], _f(o["policies"]), str(o["workers"]), _offered(o), f"{o['completed_per_s']:.0f}",
                      _f(o["p50_ms"]), _f(o["p99_ms"]), _f(o["p999_ms"]), str(o["failed_calls"])]
                     for o in results["open_loop"]])
    if results["inproc"]:
        lines += ["", f"**In process** (no gRPC; CPU per call of the whole process; {top} in flight: coroutines "
                  "through the decision pump)", ""]
        rows = []
        for row in results["inproc"]:
            a1, an = row["authorizer_1"], row[f"authorizer_{top}"]
            size = f"{row['policies']} + {_count(row['static_users'])} users" if row.get("static_users") \
                else str(row["policies"])
            rows.append([size, f"{row['decide']['p50_ms'] * 1000:.0f}", _f(a1["p50_ms"]), _f(a1["cpu_ms_per_call"]),
                         f"{an['throughput_per_s']:.0f}", _f(an["cpu_ms_per_call"])])
        lines += _table(["policies", "decide p50 us", "authorize p50 ms", "CPU ms", f"{top} in flight per s",
                         "CPU ms"], rows)
    return "\n".join(lines)
