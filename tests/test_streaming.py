"""Streamed tool-call arguments, assembled strictly (toolauthz/client/assembly.py and
streaming.py): recorded event sequences of each API shape written here, every refusal
rule, hypothesis fragmentations that must digest like the unsplit call, and the Guard
running what the stream produced against a real sidecar."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter

import pytest
from conftest import order_entity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolauthz.client import (
    AnthropicToolStream,
    AssembledCall,
    AuthzClient,
    ChatCompletionsToolStream,
    Guard,
    Principal,
    RefusedCall,
    ResponsesToolStream,
    ToolSet,
    TrustedContext,
    input_limits,
    load_output_schemas,
)
from toolauthz.client.assembly import CallAssembly
from toolauthz.digest import call_digest
from toolauthz.strict_json import parse_strict_json

REFUND = '{"order_id": "ord_1", "amount_cents": 1500, "reason": "caf\\u00e9 \u00e9t\u00e9 \U0001F4E6"}'
LOOKUP = '{"order_id": "ord_2"}'


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def answers_of(stream, events) -> list:
    out = []
    for event in events:
        out += stream.feed(event)
    return out + stream.close()


def summary(answers) -> list[tuple]:
    return [(type(a).__name__, a.call_id, a.name, a.input_json if isinstance(a, AssembledCall) else a.code)
            for a in answers]


# -- Anthropic Messages ---------------------------------------------------------------------


def anthropic_tool(index, call_id, name, text, size=5):
    yield {"type": "content_block_start", "index": index,
           "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}}
    for piece in pieces(text, size):
        yield {"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": piece}}
    yield {"type": "content_block_stop", "index": index}


def test_anthropic_text_then_two_tool_blocks_with_split_escapes_and_multibyte_text():
    events = [{"type": "message_start", "message": {"id": "msg_1"}},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Refunding."}},
              {"type": "content_block_stop", "index": 0},
              *anthropic_tool(1, "toolu_1", "issue_refund", REFUND, size=3),  # splits `\\u00e9` and the emoji
              *anthropic_tool(2, "toolu_2", "lookup_order", LOOKUP),
              {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
              {"type": "message_stop"}]
    answers = answers_of(AnthropicToolStream(), events)
    assert summary(answers) == [("AssembledCall", "toolu_1", "issue_refund", REFUND.encode()),
                                ("AssembledCall", "toolu_2", "lookup_order", LOOKUP.encode())]


def test_anthropic_interleaved_blocks_are_kept_apart_by_index():
    a, b = list(anthropic_tool(1, "toolu_a", "issue_refund", REFUND, 4)), list(anthropic_tool(2, "toolu_b",
                                                                                          "lookup_order", LOOKUP, 2))
    # both starts, then the deltas alternating, then both stops (b first)
    deltas_a, deltas_b = a[1:-1], b[1:-1]
    mixed = [a[0], b[0]]
    for i in range(max(len(deltas_a), len(deltas_b))):
        mixed += deltas_a[i:i + 1] + deltas_b[i:i + 1]
    answers = answers_of(AnthropicToolStream(), [*mixed, b[-1], a[-1]])
    assert summary(answers) == [("AssembledCall", "toolu_b", "lookup_order", LOOKUP.encode()),
                                ("AssembledCall", "toolu_a", "issue_refund", REFUND.encode())]


def test_anthropic_tool_without_arguments_is_an_empty_object():
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "ping", "input": {}}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
              {"type": "content_block_stop", "index": 0}]
    assert summary(answers_of(AnthropicToolStream(), events)) == [("AssembledCall", "toolu_1", "ping", b"{}")]


def test_sdk_objects_are_read_through_model_dump():
    class Event:
        def __init__(self, data):
            self.data = data

        def model_dump(self):
            return self.data

    answers = answers_of(AnthropicToolStream(), [Event(e) for e in anthropic_tool(0, "toolu_1", "lookup_order",
                                                                                 LOOKUP)])
    assert summary(answers) == [("AssembledCall", "toolu_1", "lookup_order", LOOKUP.encode())]


def test_a_stream_that_ends_with_an_open_call_refuses_it():
    events = list(anthropic_tool(0, "toolu_1", "issue_refund", REFUND))[:-1]  # no content_block_stop
    assert summary(answers_of(AnthropicToolStream(), events)) == [
        ("RefusedCall", "toolu_1", "issue_refund", "stream_incomplete")]


def test_a_prefix_that_parses_is_never_handed_over_before_the_block_ends():
    stream = AnthropicToolStream()
    events = list(anthropic_tool(0, "toolu_1", "lookup_order", '{"order_id": "ord_2"}   ', size=22))
    handed = [stream.feed(e) for e in events]
    assert handed[:-1] == [[]] * (len(events) - 1)  # `{"order_id": "ord_2"}` parsed after the first delta
    assert summary(handed[-1]) == [("AssembledCall", "toolu_1", "lookup_order", b'{"order_id": "ord_2"}   ')]


def test_arguments_for_a_text_block_or_an_unknown_block_break_the_stream():
    events = [*list(anthropic_tool(0, "toolu_1", "issue_refund", REFUND))[:-1],
              {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{"}},
              *anthropic_tool(2, "toolu_2", "lookup_order", LOOKUP)]
    stream = AnthropicToolStream()
    answers = answers_of(stream, events)
    assert summary(answers) == [("RefusedCall", "toolu_1", "issue_refund", "stream_broken"),
                                ("RefusedCall", "toolu_2", "lookup_order", "stream_broken")]
    assert stream.problems == ["arguments for block 1, which is not a tool call"]

    stream = AnthropicToolStream()
    late = [*anthropic_tool(0, "toolu_1", "lookup_order", LOOKUP),
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "}"}},
            *anthropic_tool(1, "toolu_2", "lookup_order", LOOKUP)]
    assert summary(answers_of(stream, late)) == [
        ("AssembledCall", "toolu_1", "lookup_order", LOOKUP.encode()),
        ("RefusedCall", "toolu_2", "lookup_order", "stream_broken")]
    assert stream.problems == ["a fragment for block 0, which ended"]

    stream = AnthropicToolStream()
    ghost = [{"type": "content_block_delta", "index": 7, "delta": {"type": "input_json_delta", "partial_json": "{"}},
             *anthropic_tool(0, "toolu_1", "lookup_order", LOOKUP)]
    assert summary(answers_of(stream, ghost)) == [("RefusedCall", "toolu_1", "lookup_order", "stream_broken")]
    assert stream.problems == ["a fragment for block 7, which was never opened"]


def test_a_call_id_reused_with_other_arguments_is_refused_and_the_same_arguments_replay():
    events = [*anthropic_tool(0, "toolu_1", "lookup_order", LOOKUP),
              *anthropic_tool(1, "toolu_1", "lookup_order", '{"order_id": "ord_9"}'),
              *anthropic_tool(2, "toolu_1", "lookup_order", LOOKUP)]
    assert summary(answers_of(AnthropicToolStream(), events)) == [
        ("AssembledCall", "toolu_1", "lookup_order", LOOKUP.encode()),
        ("RefusedCall", "toolu_1", "lookup_order", "call_id_reused"),
        ("AssembledCall", "toolu_1", "lookup_order", LOOKUP.encode())]


def test_a_block_opened_twice_and_a_bad_call_id_are_refused():
    start = {"type": "content_block_start", "index": 0,
             "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup_order", "input": {}}}
    stream = AnthropicToolStream()
    assert summary(answers_of(stream, [start, start])) == [("RefusedCall", "toolu_1", "lookup_order",
                                                            "stream_broken")]
    assert stream.problems == ["block 0 opened twice"]
    bad = list(anthropic_tool(0, "toolu_1\n", "lookup_order", LOOKUP))
    assert summary(answers_of(AnthropicToolStream(), bad)) == [("RefusedCall", "toolu_1\n", "lookup_order",
                                                                "invalid_call_id")]


def test_arguments_above_the_tools_limit_are_refused_while_streaming_and_not_kept(bundle_dir):
    limits = input_limits(bundle_dir)
    assert limits["issue_refund"] == 4096  # the example bundle's limit
    stream = AnthropicToolStream(limits)
    big = '{"order_id": "ord_1", "amount_cents": 1, "reason": "' + "x" * 5000 + '"}'
    events = list(anthropic_tool(0, "toolu_1", "issue_refund", big, size=100))
    handed = [stream.feed(e) for e in events]
    refused_at = next(i for i, a in enumerate(handed) if a)
    assert refused_at == 41  # the start, then the 41st delta crosses 4,096 bytes
    assert summary(handed[refused_at]) == [("RefusedCall", "toolu_1", "issue_refund", "input_too_large")]
    assert all(a == [] for a in handed[refused_at + 1:]) and stream.close() == []


def test_ten_thousand_one_byte_fragments_are_bounded_in_memory():
    text = '{"note": "' + "y" * 9_988 + '"}'
    assert len(text) == 10_000
    assembly = CallAssembly({"note": 20_000})
    assembly.open(0, "toolu_1", "note")
    tracemalloc.start()
    for ch in text:
        assert assembly.append(0, ch) == []
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200_000  # the text once over, not ten thousand fragment objects
    assert summary(assembly.end(0)) == [("AssembledCall", "toolu_1", "note", text.encode())]
    flood = CallAssembly({"note": 4096})
    flood.open(0, "toolu_2", "note")
    answers = [a for ch in text for a in flood.append(0, ch)]
    assert summary(answers) == [("RefusedCall", "toolu_2", "note", "input_too_large")]


def test_split_utf8_bytes_join():
    assembly = CallAssembly()
    raw = '{"city": "Zürich 📦"}'.encode()
    assembly.open(0, "toolu_1", "t")
    for i in range(len(raw)):
        assembly.append(0, raw[i:i + 1])  # every multibyte character split across fragments
    assert summary(assembly.end(0)) == [("AssembledCall", "toolu_1", "t", raw)]


def utf16_halves(text: str) -> str:
    """The text as an SDK hands it over when it decoded JSON `\\uXXXX` escapes one by one:
    every character outside the BMP as its two surrogate code points."""
    units = text.encode("utf-16-le")
    return "".join(chr(int.from_bytes(units[i:i + 2], "little")) for i in range(0, len(units), 2))


def test_a_surrogate_pair_split_across_fragments_assembles_and_digests_like_the_unsplit_call():
    unsplit = '{"note": "grin \U0001F600 and box \U0001F4E6"}'
    halves = utf16_halves(unsplit)
    high = halves.index("\ud83d")
    # `"\ud83d"` ends one fragment, `"\ude00"` starts the next (the emoji split in its halves)
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}},
              *({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}}
                for p in (halves[:high + 1], halves[high + 1:high + 3], halves[high + 3:])),
              {"type": "content_block_stop", "index": 0}]
    split = answers_of(AnthropicToolStream(), events)
    whole = answers_of(AnthropicToolStream(), anthropic_tool(0, "toolu_1", "t", unsplit, size=1000))
    escaped_text = json.dumps(json.loads(unsplit))  # the JSON escape text `\\ud83d\\ude00`, also split
    escaped = answers_of(AnthropicToolStream(), anthropic_tool(0, "toolu_1", "t", escaped_text, size=7))
    assert summary(split) == summary(whole) == [("AssembledCall", "toolu_1", "t", unsplit.encode())]
    assert split[0].input_json.decode("utf-8") == unsplit

    def digest(raw: bytes) -> str:
        return call_digest(tool="t", input=parse_strict_json(raw, max_bytes=1 << 20), principal_type="User",
                           principal_id="alice", tenant="acme", call_id="toolu_1")

    assert digest(split[0].input_json) == digest(whole[0].input_json) == digest(escaped[0].input_json)


@pytest.mark.parametrize("fragments", [
    ['{"note": "\ud83d', 'x"}'],             # a high half followed by no low half
    ['{"note": "\ud83d', '"}'],              # a high half at a fragment's end, the string then closes
    ['{"note": "', '\ude00"}'],              # a low half with no high half before it
    ['{"note": "\ude00\ud83d"}'],           # the halves in the wrong order, in one fragment
    ['{"note": "x"}', '\ud83d'],             # a high half as the very last fragment
], ids=["high-then-text", "high-then-quote", "low-alone", "reversed", "high-at-end"])
def test_a_lone_surrogate_is_refused_and_the_rest_of_the_turn_assembles(fragments):
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}},
              *({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}}
                for p in fragments),
              {"type": "content_block_stop", "index": 0},
              *anthropic_tool(1, "toolu_2", "lookup_order", LOOKUP)]
    assert summary(answers_of(AnthropicToolStream(), events)) == [
        ("RefusedCall", "toolu_1", "t", "invalid_unicode"),
        ("AssembledCall", "toolu_2", "lookup_order", LOOKUP.encode())]
    assert RefusedCall("toolu_1", "t", "invalid_unicode").to_tool_result()["is_error"] is True


def test_a_lone_surrogate_in_final_arguments_or_after_a_bytes_fragment_is_refused():
    stream = ResponsesToolStream()
    events = [{"type": "response.output_item.added", "output_index": 0,
               "item": {"type": "function_call", "id": "fc", "call_id": "call_1", "name": "t", "arguments": ""}},
              {"type": "response.function_call_arguments.done", "item_id": "fc", "arguments": '{"a": "\udfff"}'}]
    assert summary(answers_of(stream, events)) == [("RefusedCall", "call_1", "t", "invalid_unicode")]
    assembly = CallAssembly()
    assembly.open(0, "toolu_1", "t")
    assembly.append(0, '{"a": "\ud83d')
    assert summary(assembly.append(0, b'"}')) == [("RefusedCall", "toolu_1", "t", "invalid_unicode")]


# -- blocks the provider runs itself --------------------------------------------------------


def test_server_tool_blocks_are_ignored_and_every_client_call_after_them_assembles():
    """A turn as the Messages API streams it with web search and an MCP connector on: the
    server blocks stream `input_json_delta` too, and are none of the runtime's business."""
    events = [{"type": "message_start", "message": {"id": "msg_1", "content": []}},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Searching."}},
              {"type": "content_block_stop", "index": 0},
              {"type": "content_block_start", "index": 1,
               "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
              {"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": '{"query": "order'}},
              {"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": ' 4471 delays"}'}},
              {"type": "content_block_stop", "index": 1},
              {"type": "content_block_start", "index": 2,
               "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                                 "content": [{"type": "web_search_result", "url": "https://forum.example/t/9912",
                                              "title": "Delivery delays", "encrypted_content": "Eq..."}]}},
              {"type": "content_block_stop", "index": 2},
              *anthropic_tool(3, "toolu_1", "issue_refund", REFUND, size=4),
              {"type": "content_block_start", "index": 4,
               "content_block": {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "search_docs",
                                 "server_name": "docs", "input": {}}},
              {"type": "content_block_delta", "index": 4,
               "delta": {"type": "input_json_delta", "partial_json": '{"q": "refunds"}'}},
              {"type": "content_block_stop", "index": 4},
              *anthropic_tool(5, "toolu_2", "lookup_order", LOOKUP),
              {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
              {"type": "message_stop"}]
    stream = AnthropicToolStream()
    assert summary(answers_of(stream, events)) == [("AssembledCall", "toolu_1", "issue_refund", REFUND.encode()),
                                                   ("AssembledCall", "toolu_2", "lookup_order", LOOKUP.encode())]
    assert stream.problems == []


def test_a_tool_block_opened_over_a_server_blocks_index_breaks_the_stream():
    """Else the tool block's deltas would be ignored as the server block's, and the call
    would run with arguments the model never sent (`{}`)."""
    events = [{"type": "content_block_start", "index": 0,
               "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
              *anthropic_tool(0, "toolu_1", "issue_refund", REFUND),
              *anthropic_tool(1, "toolu_2", "lookup_order", LOOKUP)]
    stream = AnthropicToolStream()
    assert summary(answers_of(stream, events)) == [("RefusedCall", "toolu_2", "lookup_order", "stream_broken")]
    assert stream.problems[0] == "block 0 opened twice"


def test_more_calls_than_one_batch_are_refused():
    events = [e for i in range(66) for e in anthropic_tool(i, f"toolu_{i}", "lookup_order", LOOKUP)]
    answers = answers_of(AnthropicToolStream(), events)
    assert Counter(type(a).__name__ for a in answers) == {"AssembledCall": 64, "RefusedCall": 2}
    assert {a.code for a in answers[64:]} == {"too_many_calls"}


# -- OpenAI Chat Completions ----------------------------------------------------------------


def chat_chunk(*tool_calls, finish=None, choice=0):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "choices": [{"index": choice, "delta": {"tool_calls": list(tool_calls)} if tool_calls else {},
                         "finish_reason": finish}]}


def chat_first(index, call_id, name):
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}


def chat_more(index, text):
    return {"index": index, "function": {"arguments": text}}


def test_chat_parallel_calls_by_index_end_with_finish_reason_in_index_order():
    events = [chat_chunk(chat_first(0, "call_a", "issue_refund")), chat_chunk(chat_first(1, "call_b", "lookup_order"))]
    for x, y in zip(pieces(REFUND, 7), pieces(LOOKUP, 3) + [""] * 20, strict=False):
        events.append(chat_chunk(chat_more(1, y), chat_more(0, x)) if y else chat_chunk(chat_more(0, x)))
    events.append(chat_chunk(finish="tool_calls"))
    stream = ChatCompletionsToolStream()
    handed = [stream.feed(e) for e in events]
    assert all(h == [] for h in handed[:-1])
    assert summary(handed[-1]) == [("AssembledCall", "call_a", "issue_refund", REFUND.encode()),
                                   ("AssembledCall", "call_b", "lookup_order", LOOKUP.encode())]
    assert stream.close() == []


def test_chat_cut_off_by_length_refuses_and_a_changed_id_breaks_the_stream():
    events = [chat_chunk(chat_first(0, "call_a", "issue_refund")), chat_chunk(chat_more(0, REFUND[:20])),
              chat_chunk(finish="length")]
    assert summary(answers_of(ChatCompletionsToolStream(), events)) == [
        ("RefusedCall", "call_a", "issue_refund", "stream_incomplete")]
    stream = ChatCompletionsToolStream()
    events = [chat_chunk(chat_first(0, "call_a", "lookup_order")),
              chat_chunk({"index": 0, "id": "call_z", "function": {"arguments": LOOKUP}})]
    assert summary(answers_of(stream, events)) == [("RefusedCall", "call_a", "lookup_order", "stream_broken")]
    assert stream.problems == ["tool call (0, 0) changed its id"]
    stream = ChatCompletionsToolStream()
    assert summary(answers_of(stream, [chat_chunk(chat_more(3, "{}"))])) == []
    assert stream.problems == ["a fragment for tool call (0, 3), which was never opened"]


def test_chat_stream_without_finish_reason_refuses_its_open_calls():
    events = [chat_chunk(chat_first(0, "call_a", "lookup_order")), chat_chunk(chat_more(0, LOOKUP))]
    assert summary(answers_of(ChatCompletionsToolStream(), events)) == [
        ("RefusedCall", "call_a", "lookup_order", "stream_incomplete")]


# -- OpenAI Responses -----------------------------------------------------------------------


def responses_call(item_id, call_id, name, text, output_index=0, size=4, done_text=None):
    yield {"type": "response.output_item.added", "output_index": output_index,
           "item": {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": ""}}
    for piece in pieces(text, size):
        yield {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": output_index,
               "delta": piece}
    final = text if done_text is None else done_text
    yield {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": output_index,
           "arguments": final}
    yield {"type": "response.output_item.done", "output_index": output_index,
           "item": {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": final}}


def test_responses_keeps_the_item_id_beside_the_call_id_and_checks_the_final_arguments():
    events = [{"type": "response.created"}, *responses_call("fc_1", "call_1", "issue_refund", REFUND),
              *responses_call("fc_2", "call_2", "lookup_order", LOOKUP, output_index=1,
                              done_text='{"order_id": "ord_3"}'),
              {"type": "response.completed"}]
    answers = answers_of(ResponsesToolStream(), events)
    assert summary(answers) == [("AssembledCall", "call_1", "issue_refund", REFUND.encode()),
                                ("RefusedCall", "call_2", "lookup_order", "stream_mismatch")]
    assert answers[0].item_id == "fc_1" and answers[1].item_id == "fc_2"


def test_responses_failed_refuses_open_calls():
    events = [*list(responses_call("fc_1", "call_1", "lookup_order", LOOKUP))[:-2], {"type": "response.failed"}]
    assert summary(answers_of(ResponsesToolStream(), events)) == [
        ("RefusedCall", "call_1", "lookup_order", "stream_incomplete")]


# -- fragmentation never changes the call ---------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), data=st.data(),
       ascii_only=st.booleans(), shape=st.sampled_from(["anthropic", "chat", "responses", "bytes"]),
       halves=st.booleans())
def test_any_fragmentation_digests_like_the_unsplit_call(args, data, ascii_only, shape, halves):
    text = json.dumps(args, ensure_ascii=ascii_only)
    # `halves`: the text as an SDK that decoded escapes one by one hands it over, so a cut
    # may fall between the two halves of a surrogate pair
    unit = text.encode() if shape == "bytes" else utf16_halves(text) if halves else text
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(unit) - 1)), max_size=12)))
    parts = [unit[a:b] for a, b in zip([0, *cuts], [*cuts, len(unit)], strict=True)]
    if shape == "anthropic":
        events = [{"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}},
                  *({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "input_json_delta", "partial_json": p}} for p in parts),
                  {"type": "content_block_stop", "index": 0}]
        answers = answers_of(AnthropicToolStream(), events)
    elif shape == "chat":
        events = [chat_chunk(chat_first(0, "toolu_1", "t")), *(chat_chunk(chat_more(0, p)) for p in parts),
                  chat_chunk(finish="tool_calls")]
        answers = answers_of(ChatCompletionsToolStream(), events)
    elif shape == "responses":
        events = [{"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "function_call", "id": "fc", "call_id": "toolu_1", "name": "t", "arguments": ""}},
                  *({"type": "response.function_call_arguments.delta", "item_id": "fc", "delta": p} for p in parts),
                  {"type": "response.function_call_arguments.done", "item_id": "fc", "arguments": text}]
        answers = answers_of(ResponsesToolStream(), events)
    else:
        assembly = CallAssembly()
        assembly.open(0, "toolu_1", "t")
        for p in parts:
            assembly.append(0, p)
        answers = assembly.end(0)
    assert len(answers) == 1 and isinstance(answers[0], AssembledCall)

    def digest(raw: bytes) -> str:
        return call_digest(tool="t", input=parse_strict_json(raw, max_bytes=1 << 20), principal_type="User",
                           principal_id="alice", tenant="acme", call_id="toolu_1")

    assert answers[0].input_json == text.encode()
    assert digest(answers[0].input_json) == digest(text.encode())


# -- the Guard runs what the stream produced ------------------------------------------------


def test_the_guard_runs_assembled_calls_and_refused_ones_authorize_nothing(channel, bundle_dir, sidecar):
    runs = Counter()
    tools = ToolSet(output_schemas=load_output_schemas(bundle_dir))
    tools.register("lookup_order", lambda args, call: runs.update(["lookup"]) or {"order_id": args["order_id"],
                                                                                  "status": "shipped"})
    context = TrustedContext("acme", Principal("User", "alice"), "run-1",
                             entities=lambda call: [order_entity("ord_2", "alice")])
    guard = Guard(AuthzClient(channel, timeout=5.0), context, tools)
    events = [*anthropic_tool(0, "toolu_ok", "lookup_order", LOOKUP),
              *list(anthropic_tool(1, "toolu_cut", "lookup_order", LOOKUP))[:-1]]
    stream = AnthropicToolStream(input_limits(bundle_dir))
    results = [guard.run_assembled(a) for e in events for a in stream.feed(e)]
    results += [guard.run_assembled(a) for a in stream.close()]
    assert [(r.call_id, r.status, r.code) for r in results] == [("toolu_ok", "completed", ""),
                                                               ("toolu_cut", "failed", "stream_incomplete")]
    assert results[1].to_tool_result()["is_error"] is True and runs["lookup"] == 1
    assert sidecar.ledger.get("acme", "toolu_cut") is None  # never authorized
    again = guard.run("toolu_cut", "lookup_order", LOOKUP)  # the id is spent: it never runs later
    assert (again.status, again.code, runs["lookup"]) == ("rejected", "call_id_reused", 1)
    assert isinstance(RefusedCall("x", "t", "stream_broken").to_result().content, str)


def test_an_empty_bundle_dir_is_refused_loudly(tmp_path):
    with pytest.raises(Exception, match="tools"):
        input_limits(tmp_path)
