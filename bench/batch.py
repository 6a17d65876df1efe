"""AuthorizeBatch against single Authorize calls, in a process of its own: the cost per
decision of a model turn's parallel tool calls (4 by default), through the gRPC handlers
(called directly with a stand-in context, request message in, response out) and the
real decision pump, on one event loop. CPU time of the whole process (the pump's thread
included), so that other load on a shared machine does not count. `run_served` (and
`python -m bench.batch`) also measures a served sidecar: the CPU of its process, gRPC
included.

    singles, one after another   4 x await Authorize: 4 pump hand-offs, 4 commits
    singles, 4 at once           gather(4 x Authorize): as a runtime firing them together
    batch of 4                   await AuthorizeBatch: 1 hand-off, 1 commit
"""

from __future__ import annotations

import json
import logging
import pathlib
import statistics
import tempfile
import time
from typing import Any

from bench import bundles
from bench.inproc import PRINCIPAL, _Context, run_in_child

MODES = ("singles, one after another", "singles, 4 at once", "batch")


def _turns(count: int, per_turn: int, tools: int, prefix: str) -> list[list[tuple[Any, Any, bytes]]]:
    """`count` turns of `per_turn` calls, each (context message, call message, entities)."""
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    turns = []
    for t in range(count):
        context = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id=PRINCIPAL),
                                    request_id=f"r{prefix}-{t}")
        calls = []
        for k in range(per_turn):
            n = t * per_turn + k
            calls.append((context, pb.ToolCall(call_id=f"c{prefix}-{n}", name=bundles.tool_for(n, tools),
                                               input_json=json.dumps(bundles.request_args(n)).encode()),
                          json.dumps(bundles.request_entities(n, PRINCIPAL)).encode()))
        turns.append(calls)
    return turns


def batch_main(spec: dict, out_q) -> None:
    """Process target. spec: bundle, data_dir, turns, per_turn, tools, parent."""
    logging.basicConfig(level=logging.ERROR)
    from bench.load import exit_with_parent

    exit_with_parent(spec["parent"])
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    try:
        car = build_sidecar(Settings(bundle=spec["bundle"], data_dir=spec["data_dir"], listen="127.0.0.1:0",
                                     tokens={"lifetime_seconds": 600}))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    try:
        out = _measure(car, spec)
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        import traceback

        out = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    finally:
        car.close()
    out_q.put(out)


def _measure(car, spec: dict) -> dict:
    import asyncio

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
    from toolauthz.service.authorizer import ToolAuthorizerService

    service = ToolAuthorizerService(car.authorizer, car.pump, car.keyring, car.status, gate=car.gate)
    context = _Context()
    commits = [0]
    run_batch = car.ledger._writes._run_batch

    def counted(ops):
        commits[0] += 1
        return run_batch(ops)

    car.ledger._writes._run_batch = counted

    def single(ctx, call, entities) -> pb.AuthorizeRequest:
        msg = pb.TrustedContext()
        msg.CopyFrom(ctx)
        msg.entities_json = entities
        return pb.AuthorizeRequest(context=msg, call=call)

    async def one_after_another(turn) -> list[int]:
        return [(await service.Authorize(single(*item), context)).decision for item in turn]

    async def at_once(turn) -> list[int]:
        answers = await asyncio.gather(*(service.Authorize(single(*item), context) for item in turn))
        return [a.decision for a in answers]

    async def batch(turn) -> list[int]:
        request = pb.AuthorizeBatchRequest(context=turn[0][0], calls=[
            pb.BatchCall(call=call, entities_json=entities) for _ctx, call, entities in turn])
        answers = (await service.AuthorizeBatch(request, context)).answers
        return [a.response.decision for a in answers]

    async def timed(run, turns) -> dict:
        await run(turns[0])  # warm
        decisions, wall = [], []
        before, cpu = commits[0], time.process_time_ns()
        for turn in turns[1:]:
            began = time.perf_counter_ns()
            decisions += await run(turn)
            wall.append(time.perf_counter_ns() - began)
        cpu = time.process_time_ns() - cpu
        n = len(decisions)
        return {"decisions": n, "allowed": decisions.count(pb.ALLOW), "cpu_us_per_decision": cpu / n / 1e3,
                "wall_ms_per_turn_p50": statistics.median(wall) / 1e6, "commits_per_turn": (commits[0] - before)
                / len(wall)}

    async def main() -> dict:
        out = {}
        for rounds in range(spec["rounds"]):  # interleaved, so that a drift of the machine hits each alike
            for mode, run in zip(MODES, (one_after_another, at_once, batch), strict=True):
                turns = _turns(spec["turns"] + 1, spec["per_turn"], spec["tools"], f"{rounds}{MODES.index(mode)}")
                out.setdefault(mode, []).append(await timed(run, turns))
        return out

    measured = asyncio.run(main())
    rows = {}
    for mode, runs in measured.items():
        rows[mode] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows[mode]["decisions"] = sum(r["decisions"] for r in runs)
        rows[mode]["allowed"] = sum(r["allowed"] for r in runs)
    return {"per_turn": spec["per_turn"], "rounds": spec["rounds"], "modes": rows}


def run_batch(bundle: pathlib.Path, *, tools: int, turns: int, per_turn: int = 4, rounds: int = 3,
              data_root: str | None = None, timeout: float = 900) -> dict:
    spec = {"bundle": str(bundle), "turns": turns, "per_turn": per_turn, "rounds": rounds, "tools": tools}
    return run_in_child(batch_main, spec, name="bench-batch", data_root=data_root, timeout=timeout)


def run_served(bundle: pathlib.Path, *, tools: int, turns: int, per_turn: int = 4, rounds: int = 3,
               data_root: str | None = None) -> dict:
    """The same comparison against a served sidecar (its own process, over 127.0.0.1):
    the server process's CPU per decision, gRPC's transport and (de)serialization
    included; the client is this process."""
    import grpc

    from bench import servers
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

    with tempfile.TemporaryDirectory(prefix="bench-batch-served-", dir=data_root) as tmp:
        server = servers.start_sidecar({"bundle": str(bundle), "data_dir": str(pathlib.Path(tmp) / "data"),
                                        "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}})
        try:
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.ToolAuthorizerStub(channel)

                def single(ctx, call, entities) -> pb.AuthorizeRequest:
                    msg = pb.TrustedContext()
                    msg.CopyFrom(ctx)
                    msg.entities_json = entities
                    return pb.AuthorizeRequest(context=msg, call=call)

                def one_after_another(turn) -> list[int]:
                    return [stub.Authorize(single(*item), timeout=30).decision for item in turn]

                def at_once(turn) -> list[int]:
                    pending = [stub.Authorize.future(single(*item), timeout=30) for item in turn]
                    return [f.result().decision for f in pending]

                def batch(turn) -> list[int]:
                    request = pb.AuthorizeBatchRequest(context=turn[0][0], calls=[
                        pb.BatchCall(call=call, entities_json=entities) for _ctx, call, entities in turn])
                    return [a.response.decision for a in stub.AuthorizeBatch(request, timeout=30).answers]

                measured: dict[str, list[dict]] = {}
                for r in range(rounds):
                    for m, (mode, run) in enumerate(zip(MODES, (one_after_another, at_once, batch), strict=True)):
                        all_turns = _turns(turns + 1, per_turn, tools, f"s{r}{m}")
                        run(all_turns[0])  # warm
                        decisions, wall = [], []
                        cpu = server.cpu_seconds()
                        for turn in all_turns[1:]:
                            began = time.perf_counter_ns()
                            decisions += run(turn)
                            wall.append(time.perf_counter_ns() - began)
                        cpu = server.cpu_seconds() - cpu
                        measured.setdefault(mode, []).append({
                            "decisions": len(decisions), "allowed": decisions.count(pb.ALLOW),
                            "cpu_us_per_decision": cpu * 1e6 / len(decisions),
                            "wall_ms_per_turn_p50": statistics.median(wall) / 1e6})
        finally:
            server.stop()
    rows = {}
    for mode, runs in measured.items():
        rows[mode] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows[mode]["decisions"] = sum(r["decisions"] for r in runs)
        rows[mode]["allowed"] = sum(r["allowed"] for r in runs)
    return {"per_turn": per_turn, "rounds": rounds, "modes": rows}


def render(result: dict, policies: int) -> list[str]:
    modes = result["modes"]
    base = modes[MODES[0]]["cpu_us_per_decision"]
    lines = [f"AuthorizeBatch vs Authorize: turns of {result['per_turn']} calls, {policies} policies, through the "
             "gRPC handlers and the pump (CPU of the whole process; median of "
             f"{result['rounds']} interleaved rounds)",
             f"  {'':28} {'CPU us/decision':>15} {'vs singles':>10} {'turn p50 ms':>11} {'commits/turn':>12}"]
    for mode in MODES:
        row = modes[mode]
        lines.append(f"  {mode:28} {row['cpu_us_per_decision']:>15.0f} {row['cpu_us_per_decision'] / base:>10.2f} "
                     f"{row['wall_ms_per_turn_p50']:>11.2f} {row['commits_per_turn']:>12.2f}")
    served = result.get("served")
    if served:
        base = served["modes"][MODES[0]]["cpu_us_per_decision"]
        lines.append("  served (a sidecar process over 127.0.0.1; CPU of the server process):")
        for mode in MODES:
            row = served["modes"][mode]
            lines.append(f"  {mode:28} {row['cpu_us_per_decision']:>15.0f} "
                         f"{row['cpu_us_per_decision'] / base:>10.2f} {row['wall_ms_per_turn_p50']:>11.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.batch`: this comparison alone (`python -m bench` runs it too)."""
    import argparse
    import shutil

    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=300, help="turns per mode and round")
    parser.add_argument("--per-turn", type=int, default=4, help="calls per turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="toolauthz-bench-batch-")
    try:
        bundle = bundles.generate_bundle(pathlib.Path(root) / "bundle", args.policies)
        options = {"tools": bundles.tool_count(args.policies), "turns": args.turns, "per_turn": args.per_turn,
                   "rounds": args.rounds, "data_root": root}
        result = run_batch(bundle, **options)
        result["served"] = run_served(bundle, **options)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(render(result, args.policies)))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
