"""The servers under test, each in its own process, listening on 127.0.0.1 only.

* `noop`: a servicer for the same ToolAuthorizer service that returns canned responses
  of realistic size (a real PASETO token, a ULID, a digest): the transport floor.
* `sidecar`: the real thing, `build_sidecar` + `create_server` on a temporary data dir
  (or its one configured listener: the mTLS run).
* `workers`: `python -m toolauthz.server.workers` (N processes sharing one port).

Every server stops when told to, when its parent dies, and after `max_seconds` at most.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"
DEFAULT_MAX_SECONDS = 900.0
# Set by `bench.targets --switch-interval`: the sidecars' interpreter switch interval
# (sys.setswitchinterval), for experiments; unset, CPython's default as in `serve`.
SWITCH_INTERVAL_VARIABLE = "TOOLAUTHZ_BENCH_SWITCH_INTERVAL"


def _watchdog(stop: threading.Event, max_seconds: float, parent: int) -> None:
    """Stops the server when `parent` (the benchmark) is gone or the time is up."""
    deadline = time.monotonic() + max_seconds

    def run() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent or time.monotonic() > deadline:
                stop.set()

    threading.Thread(target=run, name="bench-watchdog", daemon=True).start()


def _serve_until_stopped(conn, stop: threading.Event) -> None:
    """Waits for "stop" on the pipe (or the watchdog); answers "timelines" meanwhile
    with the per-call timelines recorded since the last ask (toolauthz/telemetry/timeline.py)."""
    def listen() -> None:
        try:
            while conn.recv() == "timelines":
                from toolauthz.telemetry import timeline

                conn.send(timeline.drain())
        except (EOFError, OSError):
            pass
        stop.set()

    threading.Thread(target=listen, name="bench-stop", daemon=True).start()
    stop.wait()


# -- the no-op server ------------------------------------------------------------------

def canned_responses() -> tuple[bytes, bytes]:
    """An AuthorizeResponse and a VerifyResponse the size of real ones (serialized)."""
    import pyseto
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from pyseto import Key
    from ulid import ULID

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
    pub = private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    key = Key.from_asymmetric_key_params(4, d=raw)
    kid = Key.from_asymmetric_key_params(4, x=pub).to_paserk_id()
    decision_id = str(ULID())
    digest = secrets.token_hex(32)
    claims = {"iss": "toolauthz", "aud": "toolauthz-runtime", "sub": 'User::"u1"', "tenant": "acme",
              "tool": "t_00042", "call_id": "c-0-0-0-0123456789", "dig": digest, "decision_id": decision_id,
              "policy_version": secrets.token_hex(8), "jti": secrets.token_hex(16),
              "iat": "2026-11-30T12:00:00Z", "nbf": "2026-11-30T12:00:00Z", "exp": "2026-11-30T12:10:00Z"}
    token = pyseto.encode(key, json.dumps(claims, separators=(",", ":")).encode(),
                          footer=json.dumps({"kid": kid}, separators=(",", ":")).encode(),
                          implicit_assertion=digest.encode()).decode()
    response = pb.AuthorizeResponse(decision=pb.ALLOW, decision_id=decision_id, reasons=["t_00042-p0"],
                                    policy_version=claims["policy_version"], token=token, digest=digest)
    response.expires_at.seconds = int(time.time()) + 600
    verify = pb.VerifyResponse(valid=True, code="ok", decision_id=decision_id)
    return response.SerializeToString(), verify.SerializeToString()


def noop_server_main(conn, options: dict[str, Any]) -> None:
    """Process target: the transport floor, served as the sidecar serves (toolauthz/service/
    running.py: grpc.aio, coroutine handlers, the same options)."""
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
    from toolauthz.server.config import Settings
    from toolauthz.service.running import AioServer

    authorize_bytes, verify_bytes = canned_responses()
    authorize = pb.AuthorizeResponse.FromString(authorize_bytes)
    verify = pb.VerifyResponse.FromString(verify_bytes)

    class Noop(pb_grpc.ToolAuthorizerServicer):
        async def Authorize(self, request, context):
            return authorize

        async def Verify(self, request, context):
            return verify

    stop = threading.Event()
    _watchdog(stop, options.get("max_seconds", DEFAULT_MAX_SECONDS), options["parent"])
    defaults = Settings.model_fields
    max_bytes = options.get("max_message_bytes", 4 << 20)
    max_rpcs = options.get("max_concurrent_rpcs", defaults["max_concurrent_rpcs"].default)
    server = AioServer(lambda s: pb_grpc.add_ToolAuthorizerServicer_to_server(Noop(), s),
                       options=[("grpc.max_receive_message_length", max_bytes),
                                ("grpc.max_send_message_length", max_bytes),
                                ("grpc.so_reuseport", 1 if options.get("reuse_port") else 0)],
                       max_concurrent_rpcs=max_rpcs, thread_pool_size=min(32, max_rpcs), name="noop-loop",
                       max_streaming_rpcs=defaults["max_streaming_rpcs"].default)
    port = server.add_insecure_port(f"{HOST}:{options.get('port', 0)}")
    server.start()
    conn.send({"port": port, "pid": os.getpid()})
    _serve_until_stopped(conn, stop)
    server.stop(None).wait()
    conn.send({"closed": True})


# -- the real sidecar, one process -------------------------------------------------------

def sidecar_server_main(conn, settings: dict[str, Any], max_seconds: float, parent: int,
                        timelines: bool = False) -> None:
    """Process target: build_sidecar + create_server on 127.0.0.1:0, with the bundle kept
    out of the garbage collector's way as `toolauthz serve` does. `timelines`: record
    each Authorize call's timeline (`RunningServer.timelines`)."""
    if timelines:
        from toolauthz.telemetry import timeline

        timeline.enable()
    _run_sidecar(conn, settings, max_seconds, parent, shared_port=None)


def _run_sidecar(conn, settings: dict[str, Any], max_seconds: float, parent: int, *, shared_port: int | None) -> None:
    """A sidecar served until the orchestrator says stop: on a port of its own, or on
    `shared_port` with SO_REUSEPORT (fleet replicas)."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    from toolauthz.server import web
    from toolauthz.server.build import build_sidecar, create_listener_server, create_server
    from toolauthz.server.config import Settings
    from toolauthz.server.heap import keep_bundles_frozen
    from toolauthz.server.listeners import planned_http_listeners, port_of

    stop = threading.Event()
    _watchdog(stop, max_seconds, parent)
    try:
        car = build_sidecar(Settings(**settings))
        if shared_port is not None:
            server, port = create_server(car, f"{HOST}:{shared_port}", reuse_port=True)
        elif car.settings.listeners:  # the mTLS run: its one listener, as `toolauthz serve` serves it
            server, bound = create_listener_server(car, car.settings.listeners[0])
            web.start_http(car, server, planned_http_listeners(car.settings), False)  # bench/hostile.py's target
            port = port_of(bound)
        else:
            server, port = create_server(car, f"{HOST}:0")
        keep_bundles_frozen(car)
        if os.environ.get(SWITCH_INTERVAL_VARIABLE):  # an experiment's: serve keeps CPython's 5 ms
            sys.setswitchinterval(float(os.environ[SWITCH_INTERVAL_VARIABLE]))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"port": port, "pid": os.getpid(), "policy_version": car.bundles.current.version})
    _serve_until_stopped(conn, stop)
    server.stop(grace=5).wait()
    car.close()
    conn.send({"closed": True})


@dataclass
class RunningServer:
    kind: str
    port: int
    pid: int
    info: dict = field(default_factory=dict)
    _process: Any = None
    _conn: Any = None
    _popen: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time (user + system, every thread) used so far by the server process and
        its children (the workers); NaN where /proc is not available."""
        return process_tree_cpu(self.pid)

    def timelines(self) -> list[dict]:
        """The per-call timelines a sidecar started with `timelines=True` recorded since
        the last call (and forgot): [{"key": call id, "marks": [(step, ns), ...]}]."""
        self._conn.send("timelines")
        if not self._conn.poll(60):
            raise TimeoutError("the sidecar did not send its timelines")
        timelines: list[dict] = self._conn.recv()
        return timelines

    def stop(self, timeout: float = 30.0) -> None:
        if self._popen is not None:
            if self._popen.poll() is None:
                self._popen.send_signal(signal.SIGTERM)
                try:
                    self._popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    self._popen.wait()
            if self._popen.stdout:
                self._popen.stdout.close()
            return
        try:
            self._conn.send("stop")
            if self._conn.poll(timeout):
                self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            pass
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


def _start_process(kind: str, target, args: tuple, start_timeout: float) -> RunningServer:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), name=f"bench-{kind}", daemon=True)
    process.start()
    child.close()
    deadline = time.monotonic() + start_timeout
    while not parent.poll(0.5):
        if not process.is_alive() or time.monotonic() > deadline:
            process.kill()
            process.join()
            raise RuntimeError(f"{kind} server did not start (exit code {process.exitcode})")
    info = parent.recv()
    if "error" in info:
        process.join(5)
        raise RuntimeError(f"{kind} server failed to start: {info['error']}")
    return RunningServer(kind, info["port"], info["pid"], info, process, parent)


def start_noop(*, reuse_port: bool = False, port: int = 0, max_seconds: float = DEFAULT_MAX_SECONDS) -> RunningServer:
    return _start_process("noop", noop_server_main, ({"reuse_port": reuse_port, "port": port,
                                                     "max_seconds": max_seconds, "parent": os.getpid()},), 60)


def start_noop_group(processes: int, *, max_seconds: float = DEFAULT_MAX_SECONDS) -> list[RunningServer]:
    """`processes` no-op servers sharing one port with SO_REUSEPORT."""
    port = free_port()
    return [start_noop(reuse_port=True, port=port, max_seconds=max_seconds) for _ in range(processes)]


def start_sidecar(settings: dict[str, Any], *, max_seconds: float = DEFAULT_MAX_SECONDS,
                  start_timeout: float = 300, timelines: bool = False) -> RunningServer:
    return _start_process("sidecar", sidecar_server_main, (settings, max_seconds, os.getpid(), timelines),
                          start_timeout)


# `python -m toolauthz.server.workers`, plus a watchdog: SIGTERM (a clean stop) when the benchmark
# is gone or the time is up.
_WORKERS_LAUNCHER = """
import os, signal, sys, threading, time
parent, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[1])
def watch():
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True).start()
from toolauthz.server.workers import main
sys.exit(main(sys.argv[3:]))
"""


def start_workers(config_file: str, workers: int, *, start_timeout: float = 300,
                  max_seconds: float = DEFAULT_MAX_SECONDS) -> RunningServer:
    """The multi-process sidecar (`toolauthz.server.workers`), as an operator runs it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    popen = subprocess.Popen(
        [sys.executable, "-c", _WORKERS_LAUNCHER, str(max_seconds), str(os.getpid()), "--config", config_file,
         "--listen", f"{HOST}:{port}", "--workers", str(workers)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            lines.append(line.rstrip())
            if "serving" in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, name="bench-workers-stdout", daemon=True).start()
    if not ready.wait(start_timeout) or popen.poll() is not None:
        popen.kill()
        popen.wait()
        raise RuntimeError("workers did not start:\n" + "\n".join(lines[-20:]))
    return RunningServer("workers", port, popen.pid, {"workers": workers, "log": lines}, _popen=popen)


def pump_counts(address: str) -> tuple[int, int]:
    """(decisions answered, batches) of the decision pump of the sidecar process that
    answers GetStatus at `address` (with workers: one of them)."""
    import grpc

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        status = pb_grpc.ToolAuthorizerStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    return status.decisions, status.decision_batches


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _proc_table() -> dict[int, tuple[int, float]] | None:
    """Every live process's parent and CPU seconds (user + system), from /proc; None
    where /proc is not available."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[int, float]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[pid] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)  # ppid, utime + stime
    return stats


def children_of(parent: int) -> list[int]:
    """The live processes whose parent is `parent`."""
    return [pid for pid, (ppid, _) in (_proc_table() or {}).items() if ppid == parent]


def process_tree_cpu(root: int) -> float:
    """Seconds of CPU used by `root` and its live descendants, from /proc."""
    stats = _proc_table()
    if stats is None or root not in stats:
        return float("nan")
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += stats[pid][1]
        frontier += [child for child, (ppid, _) in stats.items() if ppid == pid]
    return total


# -- fleet replicas: sidecars sharing one store and one port ------------------------------

def replica_server_main(conn, settings: dict[str, Any], port: int, max_seconds: float, parent: int) -> None:
    """Process target: a sidecar on `port` with SO_REUSEPORT, so that replicas on one
    store share the address and the kernel spreads connections over them."""
    _run_sidecar(conn, settings, max_seconds, parent, shared_port=port)


def start_replicas(settings: dict[str, Any], count: int, *, max_seconds: float = DEFAULT_MAX_SECONDS,
                   start_timeout: float = 300) -> list[RunningServer]:
    """`count` sidecars on one port; the first creates the keys the others load."""
    port = free_port()
    return [_start_process("replica", replica_server_main, (settings, port, max_seconds, os.getpid()),
                           start_timeout) for _ in range(count)]
