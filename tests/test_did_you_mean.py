"""Every name a bundle or a suite checks gets the closest valid name when it is wrong,
and `check` shows the source line with a caret line under the offending text."""

from __future__ import annotations

import pytest

from toolauthz.cli.main import main as cli
from toolauthz.cli.policytest import main as policytest
from toolauthz.errors import Problem


def check(capsys, bundle) -> list[str]:
    assert cli(["check", str(bundle)]) == 1
    return capsys.readouterr().err.splitlines()


def edit(path, old: str, new: str) -> str:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path.read_text()


def located(lines: list[str], text: str, typo: str, message: str) -> None:
    """The problem at the typo's line and column, then the line, then carets under it."""
    number, source = next((n, line) for n, line in enumerate(text.splitlines(), 1) if typo in line)
    col = source.index(typo) + 1
    head = next(i for i, line in enumerate(lines) if line.startswith(f"refunds.cedar:{number}:{col}: "))
    assert lines[head].endswith(message), lines[head]
    assert lines[head + 1] == f" {number} | {source}"
    assert lines[head + 2] == f" {' ' * len(str(number))} | {' ' * (col - 1)}{'^' * len(typo)}"


def test_a_misspelt_input_attribute(capsys, bundle_dir):
    text = edit(bundle_dir / "refunds.cedar", "context.input.amount_cents <= 5000", "context.input.amout_cents <= 5000")
    located(check(capsys, bundle_dir), text, "amout_cents", "not found; did you mean `amount_cents`?")


def test_a_misspelt_entity_attribute(capsys, bundle_dir):
    text = edit(bundle_dir / "refunds.cedar", "resource.refundable_cents", "resource.refundable_cent")
    located(check(capsys, bundle_dir), text, "refundable_cent", "did you mean `refundable_cents`?")


def test_a_misspelt_tool_action(capsys, bundle_dir):
    text = edit(bundle_dir / "refunds.cedar", '"tool:issue_refund"', '"tool:isue_refund"')
    located(check(capsys, bundle_dir), text, "tool:isue_refund",
            "names action `tool:isue_refund` but no such tool is catalogued; did you mean `tool:issue_refund`?")


def test_a_misspelt_entity_type(capsys, bundle_dir):
    text = edit(bundle_dir / "measurements.cedar", "principal is User", "principal is Usr")
    lines = check(capsys, bundle_dir)
    number = next(n for n, line in enumerate(text.splitlines(), 1) if "Usr" in line)
    col = text.splitlines()[number - 1].index("Usr") + 1
    assert f"measurements.cedar:{number}:{col}: unrecognized entity type `Usr`; did you mean `User`?" in lines
    assert lines[lines.index(f"measurements.cedar:{number}:{col}: unrecognized entity type `Usr`; "
                             "did you mean `User`?") + 2].endswith(" " * (col - 1) + "^^^")


def test_a_misspelt_approval_group_points_at_the_group(capsys, bundle_dir):
    text = edit(bundle_dir / "refunds.cedar", '@approval("finance")', '@approval("finanse")')
    located(check(capsys, bundle_dir), text, "finanse", "did you mean `finance`?")


def test_a_misspelt_resource_type_of_a_tool(capsys, bundle_dir):
    edit(bundle_dir / "tools" / "issue_refund.yaml", "type: Order", "type: Ordr")
    lines = check(capsys, bundle_dir)
    assert any(line.endswith("resource type `Ordr` is not declared in schema.cedarschema; did you mean `Order`?")
               for line in lines), lines


def test_a_misspelt_runtime_group(capsys, bundle_dir):
    (bundle_dir / "bundle.yaml").write_text("principal_types: [User]\nruntime_groups: ['Group::\"finanse\"']\n")
    lines = check(capsys, bundle_dir)
    assert any(line.endswith("did you mean `Group::\"finance\"`?") for line in lines), lines


def test_nothing_close_gets_no_suggestion(capsys, bundle_dir):
    edit(bundle_dir / "refunds.cedar", '"tool:issue_refund"', '"tool:zzzzzzzz"')
    lines = check(capsys, bundle_dir)
    assert any("`tool:zzzzzzzz` but no such tool is catalogued" in line for line in lines)
    assert not any("did you mean" in line for line in lines)


def test_the_caret_line_stays_under_the_text_and_shows_no_control_characters():
    problem = Problem("a.cedar", "bad", 3, 5, excerpt="\tx\x1b[8m y", span=2)
    assert problem.render().splitlines() == ["a.cedar:3:5: bad", " 3 | ?x?[8m y", "   |     ^^"]
    assert Problem("a.cedar", "bad", 3).render() == "a.cedar:3:1: bad"  # no column: no caret


@pytest.mark.parametrize("old, new, message", [
    ("principal: alice\n", "principal: alicee\n", "unknown principal `alicee`; did you mean `alice`?"),
    ("entities: [alice_order]", "entities: [alice_ordr]",
     "unknown entity set `alice_ordr`; did you mean `alice_order`?"),
    ("reasons: [refund-own-order-small]", "reasons: [refund-own-order-smal]",
     "names `refund-own-order-smal`, which is no policy of the bundle; did you mean `refund-own-order-small`?"),
    ("approval_group: finance", "approval_group: finanse",
     "`expect.approval_group` of case `refund of 6000 needs finance approval` is `finanse`, which no `@approval` "
     "of the bundle names; did you mean `finance`?"),
    ("approval_group: finance", "approval_group: finance\n      shadow: [refund-own-order-small]",
     "`expect.shadow` of case `refund of 6000 needs finance approval` names `refund-own-order-small`, which is no "
     "@shadow policy of the bundle"),
    ("    expect:\n      decision: ALLOW", "    expct:\n      decision: ALLOW", "did you mean `expect`?"),
])
def test_misspelt_names_in_a_suite(capsys, bundle_dir, old, new, message):
    text = edit(bundle_dir / "tests" / "refunds.yaml", old, new)
    assert policytest([str(bundle_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    problem = next(line for line in captured.err.splitlines() if message in line)
    line = int(problem.split(":")[1])
    assert problem.startswith("tests/refunds.yaml:") and 1 <= line <= len(text.splitlines())
