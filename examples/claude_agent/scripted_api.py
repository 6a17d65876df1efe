"""A scripted Anthropic Messages API on 127.0.0.1, so that the Claude Agent SDK (and the
Claude Code CLI it bundles) runs offline: point `ANTHROPIC_BASE_URL` at it.

It streams (server-sent events) the way the API does: a request whose last user message
holds no tool result is answered with the scripted `tool_use` blocks, all in one turn,
their input JSON split across `input_json_delta` fragments; a request that carries tool
results is answered with a text that repeats them, which ends the turn. Every request is
kept (`requests`), and so is every tool result the model was shown (`tool_results`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 16 << 20


@dataclass(frozen=True)
class ScriptedCall:
    """One tool_use block: the provider's id, the tool, its input as JSON text."""

    call_id: str
    name: str
    input_json: str


class ScriptedMessagesApi:
    """`with ScriptedMessagesApi([ScriptedCall(...)]) as api:` then `api.base_url`."""

    def __init__(self, calls: list[ScriptedCall]):
        self.calls = list(calls)
        self.requests: list[dict[str, Any]] = []
        self.tool_results: dict[str, tuple[str, bool]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ScriptedMessagesApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def answer(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """(content blocks, stop reason) for one request."""
        with self._lock:
            self.requests.append(body)
            messages = body.get("messages") or []
            last = messages[-1].get("content") if messages else None
            results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"] \
                if isinstance(last, list) else []
            for result in results:
                self.tool_results[result.get("tool_use_id", "")] = (_text_of(result.get("content")),
                                                                     bool(result.get("is_error")))
            if results or not body.get("tools") or not self.calls:
                said = "; ".join(f"{r.get('tool_use_id')}: {_text_of(r.get('content'))}" for r in results)
                return [{"type": "text", "text": said or "ok"}], "end_turn"
            return [{"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.input_json}
                    for c in self.calls], "tool_use"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(404)
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if not self.path.startswith("/v1/messages") or length > MAX_BODY:
                    self.send_response(404)
                    self.end_headers()
                    return
                blocks, stop = api.answer(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for name, data in _events(blocks, stop):
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

        return Handler


def _events(blocks: list[dict[str, Any]], stop: str) -> list[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": 1, "output_tokens": 1}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": "scripted", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}})]
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            text = block["input"]
            middle = len(text) // 2  # two fragments: a client must put them together
            deltas = [{"type": "input_json_delta", "partial_json": part} for part in (text[:middle], text[middle:])]
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        out += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": 1}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def offline_env(api: ScriptedMessagesApi, home: str) -> dict[str, str]:
    """The environment that keeps the bundled CLI on the scripted API and off the network."""
    return {"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-scripted-offline", "HOME": home,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1"}
