"""`toolauthz authorize --server`, `toolauthz status --server` and `check --bundle`,
against a real sidecar on port 0."""

from __future__ import annotations

import json

import pytest
from conftest import order_entity

from toolauthz.cli.main import main

AMOUNT = '{"order_id": "ord_1", "amount_cents": 1500}'


def _authorize(capsys, address, *extra):
    code = main(["authorize", "--server", address, "--tenant", "acme", "--principal", 'User::"alice"',
                 "--tool", "issue_refund", "--input", AMOUNT, *extra])
    return code, capsys.readouterr()


def test_authorize_against_a_running_sidecar_records_a_decision_with_a_token(server, capsys, tmp_path):
    address = f"127.0.0.1:{server[1]}"
    entities = tmp_path / "entities.json"
    entities.write_text(json.dumps([order_entity("ord_1", "alice")]))
    code, out = _authorize(capsys, address, "--entities", str(entities))
    answer = json.loads(out.out)
    assert code == 0 and answer["decision"] == "ALLOW" and answer["token"].startswith("v4.public.")
    assert answer["decision_id"] and answer["call_id"].startswith("cli_")
    # A second run gets a fresh call id: a new decision, not a replay of the first.
    again = json.loads(_authorize(capsys, address, "--entities", str(entities))[1].out)
    assert again["call_id"] != answer["call_id"] and "replayed" not in again
    # The same call id given twice replays.
    first = json.loads(_authorize(capsys, address, "--entities", str(entities), "--call-id", "toolu_x")[1].out)
    replay = json.loads(_authorize(capsys, address, "--entities", str(entities), "--call-id", "toolu_x")[1].out)
    assert replay["replayed"] and replay["decision_id"] == first["decision_id"]


def test_authorize_remote_bad_input_is_invalid_argument_not_a_crash(server, capsys):
    code, out = _authorize(capsys, f"127.0.0.1:{server[1]}", "--call-id", "bad id\n")
    assert code == 1 and out.err.startswith("toolauthz: invalid_argument:") and "\n" not in out.err.rstrip("\n")


def test_status_lists_the_sidecar_and_every_worker(server, capsys):
    assert main(["status", "--server", f"127.0.0.1:{server[1]}"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("bundle ") and lines[1].startswith("policy version ")
    header = next(i for i, line in enumerate(lines) if line.startswith("WORKER"))
    workers = lines[header + 1:]
    assert len(workers) >= 1 and workers[0].split()[0] == "0"
    assert main(["status", "--json", "--server", f"127.0.0.1:{server[1]}"]) == 0
    assert json.loads(capsys.readouterr().out)["policyVersion"]


def test_status_of_nothing_listening_fails_cleanly(capsys):
    assert main(["status", "--server", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err.startswith("toolauthz: unavailable")


@pytest.mark.parametrize("argv", [["check", "--bundle", "policies"], ["check", "policies"], ["check"]])
def test_check_takes_the_bundle_as_an_option_or_a_positional(capsys, argv):
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_check_refuses_two_different_bundles(capsys, tmp_path):
    assert main(["check", "policies", "--bundle", str(tmp_path)]) == 1
    assert "give the bundle once" in capsys.readouterr().err
