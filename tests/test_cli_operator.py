"""Day one for an operator, through the installed console script: every command's happy
path and one mistake (an error with a suggestion, never a traceback), version, the
configuration reference and schema, and the HTTP probes of a served sidecar."""

from __future__ import annotations

import asyncio
import http.client
import importlib.metadata
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request

import pytest
from conftest import EXAMPLE_BUNDLE, ROOT
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

import toolauthz
from toolauthz.server.config.loading import ENVIRONMENT, load_settings
from toolauthz.server.config.reference import json_schema, render_reference, undescribed
from toolauthz.server.observability import start_metrics_server
from toolauthz.server.probes import BoundedRead, Readiness

TOOLAUTHZ = pathlib.Path(sys.executable).parent / "toolauthz"
CONFIGURATION_PAGE = ROOT / "docs" / "configuration.md"
RUN_TIMEOUT = 60


def toolauthz_cli(*argv: str, cwd: pathlib.Path | None = None, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    for variable in ENVIRONMENT:
        env.pop(variable, None)
    return subprocess.run([str(TOOLAUTHZ), *argv], cwd=cwd or ROOT, env=env, input=stdin, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    """A bundle, a good and a bad config, and a policy suite with a misspelled key."""
    where = tmp_path_factory.mktemp("operator")
    shutil.copytree(EXAMPLE_BUNDLE, where / "policies")
    (where / "good.yaml").write_text(f"bundle: {where / 'policies'}\nmetrics_listen: 127.0.0.1:0\n")
    (where / "bad.yaml").write_text("metric_listen: 127.0.0.1:9100\n")
    suites = where / "suites"
    shutil.copytree(where / "policies", suites)
    shutil.rmtree(suites / "tests")
    (suites / "tests").mkdir()
    (suites / "tests" / "typo.yaml").write_text(textwrap.dedent("""\
        cases:
          - name: a typo in expect
            tenant: acme
            principal: User::alice
            tool: lookup_order
            input: {order_id: ord_alice1}
            expect: {decison: ALLOW}
        """))
    shutil.copytree(ROOT / "examples" / "mcp_gateway" / "bundle", where / "mcpbundle")
    private = ed25519.Ed25519PrivateKey.generate()
    (where / "signing.pem").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (where / "signing.pem").chmod(0o600)  # a private key readable by others is refused
    (where / "signing.pub").write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return where


# -- every command: its happy path and one mistake ------------------------------------------
# (argv, exit status, a fragment of the output) with `{w}` the work directory. A mistake must
# exit non-zero with a one-line `toolauthz:` or argparse error, and never a traceback.

HAPPY = [
    (["version"], 0, "toolauthz " + toolauthz.__version__),
    (["--version"], 0, "commit: "),
    (["version", "--output", "json"], 0, '"cedar"'),
    (["config", "check", "{w}/good.yaml"], 0, "valid"),
    (["config", "schema"], 0, '"$schema"'),
    (["config", "schema", "--output", "json"], 0, '"$schema"'),
    (["config", "reference"], 0, "| `metrics_listen` |"),
    (["completion", "bash"], 0, "toolauthz"),
    (["completion", "zsh"], 0, "toolauthz"),
    (["check", "{w}/policies"], 0, "ok:"),
    (["check", "{w}/policies", "--output", "json"], 0, '"policies"'),
    (["schema", "{w}/policies"], 0, "entity"),
    (["authorize", "--bundle", "{w}/policies", "--tenant", "acme", "--principal", "User::alice", "--tool",
      "lookup_order", "--input", '{{"order_id": "ord_1"}}'], 0, '"decision"'),
    (["authorize", "--bundle", "{w}/policies", "--tenant", "acme", "--principal", "User::alice", "--tool",
      "lookup_order", "--input", '{{"order_id": "ord_1"}}', "--output", "text"], 0, "reasons: "),
    (["keys", "generate", "--keys-dir", "{w}/keys"], 0, "active"),
    (["keys", "list", "--keys-dir", "{w}/keys"], 0, "verifies=yes"),
    (["keys", "generate", "--keys-dir", "{w}/keys", "--output", "json"], 0, '"state": "'),
    (["keys", "generate", "--audit", "--data-dir", "{w}/data", "--output", "json"], 0, '"audit_key": {"kid": "'),
    (["keys", "list", "--keys-dir", "{w}/keys", "--output", "json"], 0, '"verifies": true'),
    (["test", "{w}/policies"], 0, "passed"),
    (["test", "{w}/policies", "--output", "json"], 0, '"failed": 0'),
    (["store", "migrate", "--store", "sqlite:///{w}/store.db"], 0, "schema version"),
    (["store", "prune", "--before", "7d", "--store", "sqlite:///{w}/store.db", "--output", "json"], 0,
     '{"removed": 0}'),
    (["audit", "--store", "sqlite:///{w}/store.db", "query", "--since", "1h", "--output", "json"], 0, ""),
    (["bundle", "sign", "{w}/policies", "--signing-key", "{w}/signing.pem", "--kid", "ci-1", "--revision", "3"], 0,
     "revision 3"),
    # after `bundle sign` just above (the cases run in this order)
    (["bundle", "verify", "{w}/policies", "--public-key", "ci-1={w}/signing.pub", "--output", "json"], 0,
     '"revision": 3'),
    (["catalog", "import-mcp", "--bundle", "{w}/mcpbundle", "--", sys.executable,
      str(ROOT / "examples" / "mcp_gateway" / "upstream.py")], 0, ""),
    # after the import just above: every file is there, unchanged
    (["catalog", "import-mcp", "--bundle", "{w}/mcpbundle", "--output", "json", "--", sys.executable,
      str(ROOT / "examples" / "mcp_gateway" / "upstream.py")], 0, '"action": "unchanged"'),
    (["audit", "--store", "sqlite:///{w}/store.db", "checkpoints", "--out", "{w}/cp.txt"], 0,
     "0 checkpoints written"),
    (["audit", "--store", "sqlite:///{w}/store.db", "checkpoints", "--out", "{w}/cp.txt", "--output", "json"], 0,
     '"checkpoints": 0'),
    (["audit", "--store", "sqlite:///{w}/store.db", "export", "--format", "csv"], 0, "seq,time,kind"),
    (["help-me"], 2, "invalid choice"),
    (["stauts"], 2, "did you mean `status`?"),
    (["audit", "qurey"], 2, "did you mean `query`?"),
    (["status", "--jsn"], 2, "did you mean `--json`?"),
]

MISTAKES = [
    (["config", "check", "{w}/bad.yaml"], 1, "`metric_listen`: unknown key; did you mean `metrics_listen`?\n"),
    (["config", "check", "{w}/missing.yaml"], 1, "cannot read config"),
    (["config", "frobnicate"], 2, "invalid choice"),
    (["completion", "fish"], 2, "invalid choice"),
    (["check", "{w}/nowhere"], 1, ""),
    (["schema", "{w}/nowhere"], 1, ""),
    (["authorize", "--tenant", "acme", "--principal", "alice", "--tool", "x", "--input", "{{}}"], 2,
     'principal must look like `User::"alice"`'),
    (["authorize", "--bundle", "{w}/policies", "--tenant", "acme", "--principal", "User::alice", "--tool",
      "issue_refund", "--input", "{{}}", "--fail-on-deny"], 2, '"DENY"'),
    (["keys", "rotate"], 2, "invalid choice"),
    (["test", "{w}/suites"], 1, "did you mean `decision`?"),
    (["test", "{w}/suites", "--output", "json"], 1, "needs `decision`"),
    (["store", "prune", "--before", "last tuesday", "--store", "sqlite:///{w}/store.db"], 2,
     "neither a duration such as `7d`"),
    (["store", "prune", "--before", "5m", "--store", "sqlite:///{w}/store.db"], 1, "at least an hour ago"),
    (["audit", "--data-dir", "{w}/data", "query", "--since", "yesterday"], 2, ""),
    (["approvals", "--server", "127.0.0.1:1", "list"], 1, "toolauthz:"),
    (["status", "--server", "127.0.0.1:1"], 1, "toolauthz:"),
    (["health", "--server", "127.0.0.1:1", "--timeout", "1"], 1, "toolauthz:"),
    (["bundle", "sign", "{w}/policies"], 2, "--signing-key"),
    (["policy", "impact"], 2, "--candidate"),
    (["mcp-proxy", "--config", "{w}/missing.yaml"], 1, "toolauthz:"),
    (["catalog", "import-mcp", "--bundle", "{w}/mcpbundle"], 1, "toolauthz:"),
    (["bundle", "verify", "{w}/policies", "--public-key", "ci-1={w}/nonexistent.pub"], 1, "toolauthz:"),
    (["serve", "--config", "{w}/bad.yaml"], 1, "did you mean `metrics_listen`?"),
    # `--output json` is `--log-format json`: a refusal to start is one JSON line
    (["serve", "--bundle", "{w}/nowhere", "--data-dir", "{w}/data", "--output", "json"], 1, '"problems": ['),
    (["serve", "--output", "yaml"], 2, "invalid choice: 'yaml'"),
    (["mcp-proxy", "--output", "yaml"], 2, "invalid choice: 'yaml'"),
    (["config", "schema", "--output", "text"], 2, "invalid choice: 'text' (choose from 'json')"),
    (["keys", "activate", "no-such-kid", "--keys-dir", "{w}/keys", "--output", "json"], 1, "toolauthz:"),
    (["audit", "--store", "sqlite:///{w}/store.db", "show", "call_x", "--output", "json"], 1,
     "no audit records for call `call_x`"),
    (["audit", "--store", "sqlite:///{w}/store.db", "show", "call_x", "--output", "yaml"], 2, "invalid choice"),
    (["catalog", "import-mcp", "--output", "yaml"], 2, "invalid choice"),
]


@pytest.mark.parametrize("argv, status, fragment", HAPPY + MISTAKES,
                         ids=[" ".join(case[0])[:60] for case in HAPPY + MISTAKES])
def test_every_command_answers_without_a_traceback(workdir, argv, status, fragment):
    done = toolauthz_cli(*[part.format(w=workdir) for part in argv], cwd=workdir)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    if status is not None:
        assert done.returncode == status, output
    assert fragment in output, output


def test_an_old_flag_spelling_still_works_and_warns(workdir):
    done = toolauthz_cli("bundle", "verify", str(workdir / "policies"), "--key", "kid=/nonexistent.pem")
    assert "`--key` is deprecated here; use `--public-key`" in done.stderr
    assert "Traceback" not in done.stderr and done.returncode == 1


def test_a_decision_printed_as_text_shows_a_model_written_tool_name_inert(workdir):
    done = toolauthz_cli("authorize", "--bundle", str(workdir / "policies"), "--tenant", "acme", "--principal",
                         "User::alice", "--tool", "drop\x1b[2J\nALLOW", "--input", "{}", "--output", "text")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and done.stdout.startswith("DENY")
    assert not any(line.startswith("ALLOW") for line in done.stdout.splitlines())


def test_keys_generate_and_activate_print_json(workdir):
    made = toolauthz_cli("keys", "generate", "--keys-dir", str(workdir / "rotation"), "--output", "json")
    assert made.returncode == 0, made.stderr
    printed = json.loads(made.stdout)
    assert printed["audit_key"] is None  # a keys directory alone names no data directory
    first = printed["signing_key"]
    assert first["state"] == "active"
    second = json.loads(toolauthz_cli("keys", "generate", "--keys-dir", str(workdir / "rotation"), "-o",
                                      "json").stdout)["signing_key"]
    assert second["state"] != "active"
    activated = toolauthz_cli("keys", "activate", second["kid"], "--keys-dir", str(workdir / "rotation"),
                              "--output", "json")
    assert json.loads(activated.stdout) == {"kid": second["kid"], "state": "active"}
    third = toolauthz_cli("keys", "generate", "--keys-dir", str(workdir / "rotation")).stdout.split()[0]
    assert toolauthz_cli("keys", "activate", third, "--keys-dir",
                         str(workdir / "rotation")).stdout == f"{third} active\n"


def test_json_is_an_alias_of_output_json(workdir):
    done = toolauthz_cli("status", "--json", "--server", "127.0.0.1:1")
    assert "unrecognized" not in done.stderr and done.returncode == 1


def test_a_closed_pipe_is_quiet(workdir):
    """`toolauthz config reference | head -1`: the reader leaves, the writer says nothing."""
    done = subprocess.run(f"'{TOOLAUTHZ}' config reference | head -1", shell=True, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=workdir)
    assert done.stdout == "# Configuration reference\n"
    assert done.stderr == ""


def test_version_names_what_runs():
    done = toolauthz_cli("version", "--output", "json")
    info = json.loads(done.stdout)
    assert info["version"] == toolauthz.__version__
    assert info["proto"] == "toolauthz.v1"
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["commit"] != "" and info["cedar"] != "unknown"
    assert importlib.metadata.version("toolauthz") == toolauthz.__version__  # the one source


# -- the configuration reference ------------------------------------------------------------

def test_the_configuration_page_is_the_models_reference():
    assert CONFIGURATION_PAGE.read_text() == render_reference(ENVIRONMENT), \
        "docs/configuration.md is stale: run `toolauthz config reference > docs/configuration.md`"


def test_every_key_is_described():
    assert undescribed() == []


def test_the_schema_refuses_what_the_loader_refuses():
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert "metrics_listen" in schema["properties"]
    assert schema["properties"]["metrics_listen"]["description"].startswith("HOST:PORT")


@pytest.mark.parametrize("config, expected", [
    ({"metric_listen": "x"}, "`metric_listen`: unknown key; did you mean `metrics_listen`?"),
    ({"tokens": {"lifetme_seconds": 3}}, "`tokens.lifetme_seconds`: unknown key; did you mean `lifetime_seconds`?"),
    # One bad sink kind is one error (not also "sinks should have at least 1 item").
    ({"notifications": {"sinks": [{"name": "a", "kind": "slak", "url": "https://x"}]}},
     "`notifications.sinks[0].kind`: input should be 'webhook' or 'slack'"),
    # A misspelled required key is one error (not also "`key`: field required").
    ({"listeners": [{"address": "127.0.0.1:1", "tls": {"cert": "c.pem", "kye": "k.pem"}}]},
     "`listeners[0].tls.kye`: unknown key; did you mean `key`?"),
])
def test_one_mistake_is_one_error_with_a_suggestion(tmp_path, config, expected):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(config))
    with pytest.raises(Exception) as info:
        load_settings(path)
    assert str(info.value) == f"invalid config: {expected}"


def test_a_key_that_is_not_a_string_or_holds_escapes_is_refused_inert(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('1: 2\n"evil\\e[31m": 3\n')
    done = toolauthz_cli("config", "check", str(path))
    assert done.returncode == 1
    assert "\x1b" not in done.stderr and "`evil\\x1b[31m`: unknown key" in done.stderr
    assert "keys should be strings" in done.stderr and "Traceback" not in done.stderr


# -- HTTP probes ------------------------------------------------------------------------------

def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readiness_follows_serving_the_store_and_the_drain():
    healthy = [True]
    readiness = Readiness()
    server = start_metrics_server("127.0.0.1", 0, None, readiness)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz") == (503, "NOT_SERVING\n")  # not yet serving
        readiness.serving(lambda: healthy[0])
        assert _get(f"{base}/readyz") == (200, "SERVING\n")
        healthy[0] = False  # the store cannot be read
        assert _get(f"{base}/readyz") == (503, "NOT_SERVING\n")
        healthy[0] = True
        readiness.draining()
        assert _get(f"{base}/readyz") == (503, "NOT_SERVING\n")
        assert _get(f"{base}/health")[0] == 404  # no longer the metrics
        assert _get(f"{base}/metrics")[0] == 200
    finally:
        server.close()


def test_a_probe_that_raises_is_not_ready():
    readiness = Readiness()

    def broken() -> bool:
        raise RuntimeError("the store's driver failed")

    readiness.serving(broken)
    assert readiness.ready() is False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_served_sidecar_answers_its_probes_over_http(workdir, tmp_path, workers):
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps({"bundle": str(workdir / "policies"), "listen": "127.0.0.1:0",
                                  "data_dir": str(tmp_path / "data"), "generate_missing_keys": True,
                                  "metrics_listen": "127.0.0.1:0"}))
    env = {key: value for key, value in os.environ.items() if key not in ENVIRONMENT}
    proc = subprocess.Popen([str(TOOLAUTHZ), "serve", "--config", str(config), "--workers", workers],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        url = grpc_address = ""
        for line in proc.stdout:  # blocks until the sidecar says where its metrics are
            if "serving bundle" in line:
                grpc_address = line.split(" on ")[1].split(",")[0]
            if "metrics on " in line:
                url = line.split("metrics on ")[1].split()[0].removesuffix("/metrics")
                break
        assert url, "the sidecar never announced its metrics listener"
        assert _get(f"{url}/healthz") == (200, "ok\n")
        assert _get(f"{url}/readyz") == (200, "SERVING\n")
        assert _get(f"{url}/health")[0] == 404
        status, metrics = _get(f"{url}/metrics")
        assert status == 200
        if workers == "1":  # in the multi-process sum once a worker has sampled: not awaited here
            assert 'toolauthz_build_info{cedar="' in metrics and f'version="{toolauthz.__version__}"' in metrics
            _the_remote_commands_answer(workdir, grpc_address)
            _the_audit_trail_reads_as_json(tmp_path / "data")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=RUN_TIMEOUT)


def _the_remote_commands_answer(workdir: pathlib.Path, address: str) -> None:
    """The commands that ask a running sidecar: happy paths, and a policy error explained."""
    assert toolauthz_cli("health", "--server", address).stdout == "SERVING\n"
    status = toolauthz_cli("status", "--server", address, "--output", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["workers"]
    assert toolauthz_cli("approvals", "--server", address, "list", "--tenant", "acme").returncode == 0
    ask = ["authorize", "--server", address, "--tenant", "acme", "--principal", "User::alice", "--tool",
           "issue_refund", "--input", '{"order_id": "ord_1", "amount_cents": 5}']
    # No --entities: the policies cannot read the order. The answer says why, as the local form does.
    explained = toolauthz_cli(*ask, "--bundle", str(workdir / "policies"), "--fail-on-deny")
    assert explained.returncode == 2, explained.stderr
    answer = json.loads(explained.stdout)
    assert answer["decision"] == "DENY"
    assert any("does not have the attribute `owner`" in e for e in answer["detail"]["policy_errors"])
    hinted = json.loads(toolauthz_cli(*ask, "--bundle", str(workdir / "nowhere")).stdout)
    assert "no --entities were given" in hinted["detail"]["hint"]


def test_the_documented_config_block_is_a_valid_config(tmp_path):
    readme = (ROOT / "docs" / "command-line.md").read_text()
    block = readme.split("The common ones:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text(block)
    done = toolauthz_cli("config", "check", str(path))
    assert done.returncode == 0, done.stderr


def _the_audit_trail_reads_as_json(data: pathlib.Path) -> None:
    verified = toolauthz_cli("audit", "--data-dir", str(data), "verify", "--output", "json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["ok"] is True and json.loads(verified.stdout)["records"] >= 2
    shadow = toolauthz_cli("audit", "--data-dir", str(data), "shadow", "--since", "1h", "--output", "json")
    assert json.loads(shadow.stdout)["decisions"] >= 2
    queried = toolauthz_cli("audit", "--data-dir", str(data), "query", "--kind", "authorize", "--output", "json")
    call_id = json.loads(queried.stdout.splitlines()[0])["call_id"]
    story = toolauthz_cli("audit", "--data-dir", str(data), "show", call_id, "--output", "json")
    assert story.returncode == 0, story.stderr
    told = json.loads(story.stdout)
    assert told["call_id"] == call_id and told["summary"]["decision"] == "DENY"
    assert [record["kind"] for record in told["records"]][0] == "authorize"
    as_text = toolauthz_cli("audit", "--data-dir", str(data), "show", call_id)
    assert as_text.stdout.startswith(f"call {call_id} in tenant acme")
    exported = toolauthz_cli("audit", "--data-dir", str(data), "checkpoints", "--out", str(data / "cp.txt"),
                             "--output", "json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout) == {"checkpoints": len((data / "cp.txt").read_text().splitlines()),
                                           "out": str(data / "cp.txt")}


def test_a_hung_store_read_is_not_ready_and_is_never_joined_by_a_second():
    release = threading.Event()
    reads: list[int] = []

    def hung() -> bool:
        reads.append(1)
        release.wait()
        return True

    probe = BoundedRead(hung, limit=0.05)
    try:
        assert probe() is False  # answered at the limit, not when the read ends
        assert probe() is False
        assert reads == [1]  # the second probe waited on the first read
    finally:
        release.set()


def test_store_reads_run_one_after_another_on_one_thread_of_their_own():
    """Not a thread per read: each thread would open a store connection of its own."""
    readers: list[threading.Thread] = []

    def read() -> bool:
        readers.append(threading.current_thread())
        return True

    probe = BoundedRead(read, limit=RUN_TIMEOUT)
    assert probe() and probe() and asyncio.run(probe.wait())
    assert len(readers) == 3 and len(set(readers)) == 1 and readers[0] is not threading.current_thread()


def test_the_mcp_gateway_reports_the_version(bundle_dir):
    from toolauthz.client import Principal
    from toolauthz.mcp_proxy.proxy import McpProxy, ProxySettings

    proxy = McpProxy(ProxySettings(bundle=bundle_dir, tenant="acme", principal=Principal("User", "alice")),
                     authz=None)  # type: ignore[arg-type]  # never called: only its server's options are read
    assert proxy.server.create_initialization_options().server_version == toolauthz.__version__


@pytest.mark.parametrize("host, status", [("127.0.0.1", 200), ("localhost:9464", 200), ("[::1]:1", 200),
                                          ("rebound.example:9464", 403), ("10.0.0.5:9464", 403), ("", 403)])
def test_the_metrics_listener_answers_only_a_host_no_dns_name_can_rebind(host, status):
    server = start_metrics_server("127.0.0.1", 0, None, Readiness())
    try:
        for path in ("/metrics", "/healthz"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.putrequest("GET", path, skip_host=True)
            if host:
                connection.putheader("Host", host)
            connection.endheaders()
            answer = connection.getresponse()
            answer.read()
            connection.close()
            assert answer.status == status, (path, host)
    finally:
        server.close()
