"""Shadow disagreements are read back from the audit trail: they survive a restart, and
`audit show` prints a call's under its decision."""

from __future__ import annotations

import json

from toolauthz.cli.main import main
from toolauthz.model import Principal, ProposedCall, TrustedContext

MEASURE = {"prototype": "A", "metric": "runtime", "unit": "hours"}
SHADOW = ('@id("shadow-no-measure-b")\n@shadow\n'
          'forbid (principal, action == Action::"tool:measure_runtime", resource)\n'
          'when { context.input.prototype == "B" };\n')


def decide_measures(settings, bundle_dir, clock, prototypes: str) -> None:
    """A sidecar with the shadow policy decides one measurement per prototype, then stops."""
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "shadow.cedar").write_text(SHADOW)
    ctx = TrustedContext("acme", Principal("User", "alice"), "r")
    car = build_sidecar(settings, clock=clock)
    try:
        for i, prototype in enumerate(prototypes):
            car.authorizer.authorize(ctx, ProposedCall(f"c{i}", "measure_runtime",
                                                       json.dumps({**MEASURE, "prototype": prototype}).encode()))
    finally:
        car.close()


def test_counts_survive_a_restart_and_show_prints_the_disagreement(settings, bundle_dir, clock, capsys):
    from toolauthz.server.build import build_sidecar

    decide_measures(settings, bundle_dir, clock, "ABBAB")
    restarted = build_sidecar(settings, clock=clock)
    restarted.close()
    assert restarted.authorizer.shadow_effects() == {}  # a process's own count starts again...
    store = ["--store", f"sqlite://{settings.database_path.absolute()}"]
    assert main(["audit", "shadow", *store]) == 0  # ...the audit trail's does not
    assert capsys.readouterr().out.splitlines() == ["3 shadow disagreements in 5 decisions",
                                                    "         3  shadow-no-measure-b"]
    assert main(["audit", "shadow", *store, "--tenant", "globex"]) == 0
    assert capsys.readouterr().out.splitlines() == ["0 shadow disagreements in 0 decisions"]
    assert main(["audit", "show", "c1", *store]) == 0
    out = capsys.readouterr().out
    assert "shadow: would DENY because shadow-no-measure-b" in out
    assert main(["audit", "show", "c0", *store]) == 0
    assert "shadow:" not in capsys.readouterr().out


def test_the_console_status_page_counts_from_the_trail_after_a_restart(settings, bundle_dir, clock):
    from console_pages import browser, console_for, sign_in

    from toolauthz.server.build import build_sidecar

    decide_measures(settings, bundle_dir, clock, "ABB")
    restarted = build_sidecar(settings, clock=clock)
    try:
        assert restarted.authorizer.shadow_effects() == {}  # this process has counted nothing
        client = browser(console_for(restarted))
        sign_in(client, "carol", groups="auditors")
        page = client.get("/status").text
        assert '<tr data-testid="shadow-row"><td class="code">shadow-no-measure-b</td><td>2</td></tr>' in page
        assert "the 3 decisions" in page
        other = browser(console_for(restarted))
        sign_in(other, "gus", "globex", groups="auditors")
        assert 'id="no-shadow"' in other.get("/status").text  # another tenant's decisions are not counted
    finally:
        restarted.close()
