"""The policy author's commands: authorize one call locally, check, keys."""

from __future__ import annotations

import json

from sidecar.cli.main import main


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
    assert code == 0 and out.startswith("ok: 3 tools, 6 policies")


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


def test_serve_with_a_config_refuses_missing_keys(capsys, tmp_path):
    config = tmp_path / "toolauthz.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nlisten: 127.0.0.1:0\n")
    code, _, err = run(capsys, "serve", "--config", str(config))
    assert code == 1 and "cannot open key directory" in err, err
