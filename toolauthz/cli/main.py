"""`toolauthz`: serve, check and try policies, manage keys."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys

import grpc

from toolauthz.bundle import load_bundle
from toolauthz.cli.approvals import DEFAULT_SERVER, SERVER_ENV, add_approvals_command
from toolauthz.cli.audit import add_audit_command
from toolauthz.cli.bundle import add_bundle_command
from toolauthz.cli.hook import add_hook_command
from toolauthz.cli.impact import add_policy_command
from toolauthz.cli.mcp import add_mcp_commands
from toolauthz.cli.operator import add_operator_commands
from toolauthz.cli.options import add_server_options, parse_principal
from toolauthz.cli.output import add_output_option, wants_json
from toolauthz.cli.parser import SuggestingParser
from toolauthz.cli.policytest import add_test_command
from toolauthz.cli.remote import add_status_command, decision_json, deny_status, print_decision
from toolauthz.cli.store import add_store_command
from toolauthz.clock import SystemClock
from toolauthz.display.escape import bounded_message, use_escaping_formatter
from toolauthz.errors import BundleError, RequestError, ToolAuthzError
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.server.cpu import available_cpus
from toolauthz.server.reload_requests import release_early


def cmd_serve(args) -> int:
    from toolauthz.server.config import load_settings
    from toolauthz.server.logs import report_problems
    from toolauthz.server.reload_requests import reload_requests
    from toolauthz.server.workers import configure_process_logging, serve_workers

    # First (the console script installed it before its imports): a SIGHUP while starting
    # must not kill the sidecar.
    with reload_requests() as reloads:
        settings = load_settings(args.config, bundle=args.bundle, listen=args.listen, data_dir=args.data_dir,
                                 log_format=args.log_format, log_level=args.log_level,
                                 console_listen=args.console_listen, store=args.store,
                                 store_migrate=args.migrate or None)
        configure_process_logging(settings)
        if settings.log_format == "text":
            return serve_workers(settings, args.workers, reloads)
        try:  # with JSON logs, a refusal to start is a JSON line too
            return serve_workers(settings, args.workers, reloads)
        except BundleError as exc:
            report_problems("bundle refused", [str(p) for p in exc.problems], "json")
        except (ToolAuthzError, RequestError, OSError) as exc:
            report_problems("cannot serve", [bounded_message(str(exc))], "json")
        return 1


def cmd_check(args) -> int:
    from toolauthz.server.config import load_settings
    from toolauthz.server.reload import load_bundle_snapshot

    if args.bundle_option and args.bundle and args.bundle_option != args.bundle:
        raise ToolAuthzError("give the bundle once: as `--bundle DIR` or as the positional DIR")
    verification = load_settings(args.config).bundle_verification
    try:
        bundle = load_bundle_snapshot(args.bundle_option or args.bundle or "policies",
                                      verification.public_keys() if verification else None)
    except BundleError as exc:
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        print(f"{len(exc.problems)} problem(s); bundle refused", file=sys.stderr)
        return 1
    if verification is None:
        print("warning: `bundle_verification` is not configured: whoever can write the bundle directory changes "
              "what is enforced (see `toolauthz bundle sign`)", file=sys.stderr)
    if wants_json(args):
        print(json.dumps({"ok": True, "tools": len(bundle.tools), "policies": len(bundle.policies),
                          "version": bundle.version, "revision": bundle.revision}))
        return 0
    signed = f", signed revision {bundle.revision}" if bundle.revision is not None else ""
    print(f"ok: {len(bundle.tools)} tools, {len(bundle.policies)} policies, version {bundle.version}{signed}")
    return 0


def cmd_schema(args) -> int:
    print(load_bundle(args.bundle).schema_text, end="")
    return 0


def cmd_authorize(args) -> int:
    if args.server:
        from toolauthz.cli.remote import authorize_remote
        return authorize_remote(args)
    from toolauthz.engine import decide

    bundle = load_bundle(args.bundle)
    entities = pathlib.Path(args.entities).read_bytes() if args.entities else b""
    ctx = TrustedContext(args.tenant, args.principal, "cli", entities)
    ctx.check()
    verdict = decide(bundle, ctx, ProposedCall("cli", args.tool, args.input.encode()))
    print_decision(args, decision_json(verdict.decision.value, verdict.reasons,
                                       [(e.code, e.message) for e in verdict.errors], bundle.version,
                                       approval_group=verdict.approval_group, detail=verdict.detail))
    return deny_status(args, verdict.decision.value)


def cmd_keys(args) -> int:
    from toolauthz.server.config import load_settings
    from toolauthz.tokens import keyring as keys

    settings = load_settings(args.config, data_dir=args.data_dir)
    clock = SystemClock()
    directory = args.keys_dir or settings.keys_dir
    if args.keys_command == "generate":
        audit_key = _audit_key_file(args, settings)
        if not args.audit:
            info = keys.generate_key(directory, clock=clock)
            print(f"{info.kid} {info.state}")
        if audit_key is not None and (args.audit or not os.path.lexists(audit_key)):
            _generate_audit_key(audit_key)
    elif args.keys_command == "activate":
        keys.activate_key(directory, args.kid, clock=clock)
        print(f"{args.kid} active")
    else:
        listed = keys.list_keys(directory, clock=clock, grace_seconds=settings.key_grace_seconds())
        if wants_json(args):
            print(json.dumps([{"kid": info.kid, "state": info.state, "verifies": info.verifies} for info in listed],
                             indent=2))
        else:
            for info in listed:
                print(f"{info.kid}  {info.state:9}  verifies={'yes' if info.verifies else 'no'}")
    return 0


def _audit_key_file(args, settings) -> pathlib.Path | None:
    """`<data_dir>/audit-key.pem`, where the sidecar looks for it. A `--keys-dir` alone
    names no data directory, so it gets no audit key unless `--audit` asks for one."""
    data_dir_named = args.data_dir or args.config or os.environ.get("TOOLAUTHZ_DATA_DIR")
    if args.keys_dir and not data_dir_named:
        if args.audit:
            raise ToolAuthzError("`keys generate --audit` writes `<data_dir>/audit-key.pem`: "
                                 "give --data-dir or --config")
        return None
    return pathlib.Path(settings.audit_key_file)


def _generate_audit_key(path: pathlib.Path) -> None:
    """The key that signs audit checkpoints: Ed25519, mode 0600, never overwritten."""
    from toolauthz.tokens.keys import generate_key_file

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    kid = generate_key_file(path)
    print(f"audit key {kid} created at {path}")


def cmd_health(args) -> int:
    """For container health checks and exec probes: one Check call, no retries."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    server = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    with grpc.insecure_channel(server) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        # types-grpcio-health-checking declares the stub without its methods.
        answer = stub.Check(health_pb2.HealthCheckRequest(service=args.service),  # type: ignore[attr-defined]
                            timeout=args.timeout)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    print(json.dumps({"status": status}) if wants_json(args) else status)
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1


def build_parser() -> argparse.ArgumentParser:
    # Declared as its base: the add_*_command helpers take any parser's sub-commands.
    parser: argparse.ArgumentParser = SuggestingParser(prog="toolauthz", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sidecar")
    serve.add_argument("--bundle")
    serve.add_argument("--listen", help="HOST:PORT or unix:///PATH, plaintext (default 127.0.0.1:50051)")
    serve.add_argument("--data-dir")
    serve.add_argument("--config")
    serve.add_argument("--store", help="sqlite:///path or postgresql://... (default: <data-dir>/toolauthz.db)")
    serve.add_argument("--migrate", action="store_true", help="upgrade an older PostgreSQL schema before serving")
    serve.add_argument("--workers", type=int, default=available_cpus(),
                       help="processes sharing the address (default: one per CPU this process may use: the "
                            "cgroup's CPU quota, else the affinity mask)")
    serve.add_argument("--log-format", choices=["text", "json"], help="log lines as text (default) or JSON objects")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="the least severe level logged (default: info; config `log_level`)")
    serve.add_argument("--console-listen", help="HOST:PORT of the browser console for approvers and auditors "
                                                "(docs/console.md); default: off")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check", help="load and validate a bundle")
    check.add_argument("bundle", nargs="?", help="the bundle directory (default: policies)")
    check.add_argument("--bundle", dest="bundle_option", metavar="DIR", help="the same, as `serve` takes it")
    check.add_argument("--config", help="verify the bundle's signature with this config's bundle_verification")
    add_output_option(check)
    check.set_defaults(func=cmd_check)

    schema = sub.add_parser("schema", help="print the Cedar schema generated for a bundle")
    schema.add_argument("bundle", nargs="?", default="policies")
    schema.set_defaults(func=cmd_schema)

    authorize = sub.add_parser("authorize", help="one decision, printed as JSON: local (--bundle), or asked of a "
                                                 "running sidecar (--server)")
    authorize.add_argument("--bundle", default="policies", help="local: the bundle directory (default: policies)")
    add_server_options(authorize, [], "HOST:PORT or unix:///path of a running sidecar: ask it instead of "
                                      "deciding locally (the decision is then recorded, and may carry a token)")
    authorize.add_argument("--call-id", help="with --server: the call id (default: a fresh one per run)")
    authorize.add_argument("--request-id", default="cli", help="with --server: the run's request id (default: cli)")
    authorize.add_argument("--tenant", required=True)
    authorize.add_argument("--principal", required=True, type=parse_principal)
    authorize.add_argument("--tool", required=True)
    authorize.add_argument("--input", required=True, help="the arguments as JSON")
    authorize.add_argument("--entities", help="a file with trusted Cedar entities (JSON array)")
    authorize.add_argument("--fail-on-deny", action="store_true", help="exit 2 when the decision is DENY")
    add_output_option(authorize, default="json")
    authorize.set_defaults(func=cmd_authorize)

    keys = sub.add_parser("keys", help="token signing keys")
    keys.add_argument("keys_command", choices=["generate", "list", "activate"])
    keys.add_argument("kid", nargs="?")
    keys.add_argument("--keys-dir")
    keys.add_argument("--data-dir")
    keys.add_argument("--config")
    keys.add_argument("--audit", action="store_true",
                      help="generate: only the audit checkpoint key "
                           "(`keys generate` alone also creates it when missing)")
    add_output_option(keys)
    keys.set_defaults(func=cmd_keys)

    health = sub.add_parser("health", help="ask a running sidecar's gRPC health service; exit 0 when serving")
    health.add_argument("--server", help=f"HOST:PORT or unix:///path (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    health.add_argument("--service", default="", help="a service name (default: the whole server)")
    health.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    add_output_option(health)
    health.set_defaults(func=cmd_health)

    add_approvals_command(sub, parse_principal)
    add_audit_command(sub)
    add_test_command(sub)
    add_mcp_commands(sub, parse_principal)
    add_store_command(sub)
    add_status_command(sub)
    add_bundle_command(sub)
    add_policy_command(sub)
    add_operator_commands(parser, sub)
    add_hook_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    use_escaping_formatter(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args.func is not cmd_serve:
        release_early()  # the console script's SIGHUP deferral is for `serve` only
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away is noticed here, not at exit
        return status
    except BrokenPipeError:
        return _reader_gone()
    except BundleError as exc:
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        return 1
    except (ToolAuthzError, RequestError, OSError) as exc:
        print(f"toolauthz: {bounded_message(str(exc))}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"toolauthz: {exc.code().name.lower()}: {bounded_message(exc.details() or '')}", file=sys.stderr)
        return 1


def _reader_gone() -> int:
    """`toolauthz status | head`: the reader closed the pipe. Quiet, as `cat` is; what
    is still buffered goes nowhere instead of raising again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe


if __name__ == "__main__":
    sys.exit(main())
