"""The policy author's commands: authorize one call locally, check, keys."""

from __future__ import annotations

import json
import stat

from toolauthz.cli.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_authorize_prints_a_local_decision(capsys, tmp_path):
    entities = tmp_path / "e.json"
    entities.write_text(json.dumps([{"uid": {"type": "Order", "id": "ord_1"}, "parents": [],
                                     "attrs": {"owner": {"__entity": {"type": "User", "id": "alice"}},
                                               "refundable_cents": 10000}}]))
    base = ["authorize", "--bundle", "policies", "--tenant", "acme", "--principal", 'User::"alice"',
            "--tool", "issue_refund", "--entities", str(entities), "--input"]
    code, out, _ = run(capsys, *base, '{"order_id":"ord_1","amount_cents":7000}')
    decision = json.loads(out)
    assert code == 0 and decision["decision"] == "APPROVAL_REQUIRED" and decision["approval_group"] == "finance"
    code, out, _ = run(capsys, *base, '{"order_id":"ord_1","amount_cents":7000,"amount_cents":1}')
    assert json.loads(out)["errors"][0]["code"] == "invalid_input"


def test_authorize_rejects_a_malformed_principal(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["authorize", "--tenant", "acme", "--principal", "alice", "--tool", "x", "--input", "{}"])
    assert "principal must look like" in capsys.readouterr().err


def test_check_ok_on_the_example_bundle(capsys):
    code, out, _ = run(capsys, "check", "policies")
    assert code == 0 and out.startswith("ok: 3 tools, 7 policies")


def test_keys_generate_list_activate(capsys, tmp_path):
    keys = str(tmp_path / "keys")
    code, out, _ = run(capsys, "keys", "generate", "--keys-dir", keys)
    first = out.split()[0]
    assert code == 0 and out.split()[1] == "active"
    code, out, _ = run(capsys, "keys", "generate", "--keys-dir", keys)
    second = out.split()[0]
    assert out.split()[1] == "published"
    assert run(capsys, "keys", "activate", second, "--keys-dir", keys)[0] == 0
    code, out, _ = run(capsys, "keys", "list", "--keys-dir", keys)
    states = {line.split()[0]: line.split()[1] for line in out.splitlines()}
    assert states == {first: "retired", second: "active"}


def test_serve_refuses_to_start_with_a_world_readable_key(capsys, tmp_path):
    data = tmp_path / "data"
    assert run(capsys, "keys", "generate", "--keys-dir", str(data / "keys"))[0] == 0
    key_file = next((data / "keys").glob("*.pem"))
    key_file.chmod(0o644)
    code, _, err = run(capsys, "serve", "--data-dir", str(data), "--listen", "127.0.0.1:0")
    assert code == 1 and "toolauthz:" in err and str(key_file) in err


def test_serve_with_a_config_names_the_command_that_creates_missing_keys(capsys, tmp_path):
    data = tmp_path / "data"
    config = tmp_path / "toolauthz.yaml"
    config.write_text(f"data_dir: {data}\nlisten: 127.0.0.1:0\n")
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 1 and f"`toolauthz keys generate --data-dir {data}`" in err, err
    assert not (data / "keys").exists()  # a config file never generates keys

    assert run(capsys, "keys", "generate", "--keys-dir", str(data / "keys"))[0] == 0  # token keys alone
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 1 and f"`toolauthz keys generate --audit --data-dir {data}`" in err, err


def test_keys_generate_creates_the_audit_key_too_with_mode_0600(capsys, tmp_path):
    data = tmp_path / "data"
    code, out, _ = run(capsys, "keys", "generate", "--data-dir", str(data))
    audit_key = data / "audit-key.pem"
    assert code == 0 and out.splitlines()[0].split()[1] == "active"
    assert out.splitlines()[1].startswith("audit key k4.pid.") and str(audit_key) in out
    assert stat.S_IMODE(audit_key.stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "keys").stat().st_mode) == 0o700
    for key_file in (data / "keys").glob("*"):
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    audit_pem = audit_key.read_bytes()

    code, out, _ = run(capsys, "keys", "generate", "--data-dir", str(data))  # a rotation
    assert code == 0 and out.split()[1] == "published" and "audit key" not in out
    assert audit_key.read_bytes() == audit_pem  # never replaced

    code, _, err = run(capsys, "keys", "generate", "--audit", "--data-dir", str(data))
    assert code == 1 and "already exists" in err and audit_key.read_bytes() == audit_pem


def test_keys_generate_audit_alone_and_the_sidecar_starts_on_them(capsys, tmp_path, bundle_dir):
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import load_settings

    data = tmp_path / "data"
    assert run(capsys, "keys", "generate", "--keys-dir", str(data / "keys"))[0] == 0
    assert not (data / "audit-key.pem").exists()  # a keys dir alone names no data dir
    code, out, _ = run(capsys, "keys", "generate", "--audit", "--data-dir", str(data))
    assert code == 0 and out.startswith("audit key ") and len(list((data / "keys").glob("*.pem"))) == 1
    config = tmp_path / "toolauthz.yaml"
    config.write_text(f"data_dir: {data}\nbundle: {bundle_dir}\nreload_poll_seconds: 0\n")
    build_sidecar(load_settings(config)).close()  # production start: no generation, keys found


def test_keys_generate_audit_needs_a_data_dir(capsys, tmp_path):
    code, _, err = run(capsys, "keys", "generate", "--audit", "--keys-dir", str(tmp_path / "keys"))
    assert code == 1 and "--data-dir" in err and not (tmp_path / "keys").exists()


def test_health_answers_serving_for_a_running_sidecar(capsys, server):
    _srv, port = server
    code, out, _ = run(capsys, "health", "--server", f"127.0.0.1:{port}")
    assert (code, out.strip()) == (0, "SERVING")
    code, out, _ = run(capsys, "health", "--server", f"127.0.0.1:{port}", "--service", "toolauthz.v1.ToolAuthorizer")
    assert (code, out.strip()) == (0, "SERVING")


def test_health_fails_when_nothing_answers(capsys, tmp_path):
    code, _, err = run(capsys, "health", "--server", f"unix://{tmp_path}/absent.sock", "--timeout", "5")
    assert code == 1 and "toolauthz: unavailable" in err, err


def test_health_fails_for_an_unknown_service(capsys, server):
    _srv, port = server
    code, _, err = run(capsys, "health", "--server", f"127.0.0.1:{port}", "--service", "no.such.Service")
    assert code == 1 and "not_found" in err, err
