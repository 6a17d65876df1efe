"""Tool calls put together from streamed argument fragments, strictly.

Model APIs stream a tool call's arguments as fragments of JSON text. `CallAssembly` keeps
them by the stream's own key (a content block index, a tool-call index, an output item
id), bounded, and hands a call over only when the protocol says its block has ended:
never a prefix that happens to parse. The adapters for each API's events are in
`client/streaming.py`; this module knows no API.

Every tool block the stream opens gets exactly one answer from the assembly, either an
`AssembledCall` (give it to the Guard) or a `RefusedCall` (its error result for the model;
nothing was authorized), in the order the blocks end. The rules:

* a call's arguments above its tool's `max_input_bytes` are refused as soon as they pass
  it (the rest of its fragments are dropped, not kept);
* a call id used by two blocks of one stream: the later one is handed over only if its
  arguments are byte-for-byte the earlier one's (the Guard then replays the first call's
  result and runs nothing); otherwise it is refused `call_id_reused`;
* an unusable call id (the sidecar's call id rules) is refused `invalid_call_id`;
* more than `max_calls` blocks in one stream (64: one turn's batch): the rest are refused
  `too_many_calls`;
* a stream that ends with a call still open refuses it `stream_incomplete`;
* text fragments are joined as text: an SDK that decoded the event's JSON hands over a
  character outside the BMP split into its two UTF-16 halves when the provider split it
  (`"\\ud83d"` + `"\\ude00"`), and the halves join into the one character, so the call
  has the same bytes (and digest) as the unsplit call; a half left alone (a lone
  surrogate) cannot be UTF-8 and is refused `invalid_unicode`;
* a fragment for a call the stream never opened, or for one that already ended, or a
  block opened twice, breaks the stream: every call still open is refused
  `stream_broken`, and so is every call after it. `problems` says what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from toolauthz.client.context import check_call_id
from toolauthz.client.results import FAILED, CallResult
from toolauthz.model import TOOL_NAME

__all__ = ["AssembledCall", "RefusedCall", "CallAssembly", "DEFAULT_MAX_INPUT_BYTES", "MAX_CALLS",
           "REFUSALS"]

DEFAULT_MAX_INPUT_BYTES = 65536  # the sidecar's default `limits.max_input_bytes`
MAX_CALLS = 64  # a batch's default `max_calls`: one turn's calls are authorized in one batch
MAX_NAME_CHARS = 256
MAX_PROBLEMS = 16

# The model-safe text of each refusal: what the model reads in the call's error result.
REFUSALS = {
    "input_too_large": "The call's arguments are larger than this tool accepts; it was not executed.",
    "invalid_call_id": "The call has an unusable id and was not executed.",
    "call_id_reused": "This call id was already used for a different call; it was not executed.",
    "stream_incomplete": "The call's arguments did not finish streaming; it was not executed.",
    "stream_broken": "The response stream was malformed; the call was not executed.",
    "stream_mismatch": "The call's streamed arguments disagree with its final arguments; it was not executed.",
    "too_many_calls": "Too many tool calls were proposed at once; this one was not executed.",
    "invalid_unicode": "The call's arguments are not valid Unicode text; it was not executed.",
}


@dataclass(frozen=True)
class AssembledCall:
    """A call whose block ended: the exact argument bytes the model sent, for the Guard."""
    call_id: str
    name: str
    input_json: bytes
    item_id: str = ""  # the provider's own item id where it differs from the call id (Responses API)


@dataclass(frozen=True)
class RefusedCall:
    """A call the assembly refused: never authorized, never run."""
    call_id: str
    name: str
    code: str
    item_id: str = ""

    def to_result(self) -> CallResult:
        return CallResult(self.call_id, self.name, FAILED, code=self.code, content=REFUSALS[self.code])

    def to_tool_result(self) -> dict:
        return self.to_result().to_tool_result()


Answer = AssembledCall | RefusedCall


class _Open:
    __slots__ = ("call_id", "name", "item_id", "limit", "data", "refused", "high")

    def __init__(self, call_id: str, name: str, item_id: str, limit: int):
        self.call_id, self.name, self.item_id, self.limit = call_id, name, item_id, limit
        self.data = bytearray()
        self.refused = ""  # the refusal already answered for this call, if any
        self.high = ""  # a high surrogate that ended the last text fragment: its pair may follow


def _is_high_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


def _utf8(text: str) -> bytes | None:
    """UTF-8 of text whose surrogate pairs are joined into their characters; None when a
    surrogate is left alone (no UTF-8 exists for it)."""
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le").encode("utf-8")
    except UnicodeError:
        return None


class CallAssembly:
    """The calls of one streamed model response, keyed by the stream's own keys.

    `limit_of(name)` gives a tool's `max_input_bytes` (see `input_limits`); a tool it does
    not know gets `default_max_input_bytes`. Not thread-safe: one stream, one reader."""

    def __init__(self, limit_of: Callable[[str], int | None] | Mapping[str, int] | None = None, *,
                 default_max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES, max_calls: int = MAX_CALLS):
        if isinstance(limit_of, Mapping):
            limits = dict(limit_of)
            limit_of = limits.get
        self._limit_of = limit_of or (lambda name: None)
        self._default = default_max_input_bytes
        self._max_calls = max_calls
        self._blocks = 0
        self._open: dict[Hashable, _Open] = {}
        self._ended: set[Hashable] = set()
        self._finished: dict[str, bytes | None] = {}  # call id -> its arguments (None: refused)
        self.problems: list[str] = []
        self.broken = False

    # -- what the adapters call -------------------------------------------------------

    def open(self, key: Hashable, call_id: str, name: str, *, item_id: str = "") -> list[Answer]:
        """A call's block starts."""
        if key in self._open or key in self._ended:
            return self.fail(f"block {key!r} opened twice")
        name = name if isinstance(name, str) else ""
        call_id = call_id if isinstance(call_id, str) else ""
        call = _Open(call_id, name[:MAX_NAME_CHARS], item_id, self._limit(name))
        self._open[key] = call
        self._blocks += 1
        if self.broken:
            return self._refuse(call, "stream_broken")
        if self._blocks > self._max_calls:
            return self._refuse(call, "too_many_calls")
        try:
            check_call_id(call_id)
        except ValueError:
            return self._refuse(call, "invalid_call_id")
        return []

    def append(self, key: Hashable, fragment: str | bytes) -> list[Answer]:
        """Another piece of a call's argument text."""
        call = self._open.get(key)
        if call is None:
            why = "ended" if key in self._ended else "was never opened"
            return self.fail(f"a fragment for block {key!r}, which {why}")
        if call.refused:
            return []
        piece = self._piece(call, fragment)
        if piece is None:
            return self._refuse(call, "invalid_unicode")
        if len(call.data) + len(piece) > call.limit:
            return self._refuse(call, "input_too_large")
        call.data += piece
        return []

    def is_open(self, key: Hashable) -> bool:
        return key in self._open

    def has_ended(self, key: Hashable) -> bool:
        return key in self._ended

    def end(self, key: Hashable, *, final: str | bytes | None = None, empty: bytes = b"{}") -> list[Answer]:
        """A call's block ended. `final`, when the API repeats the whole arguments at the
        end, must equal what was streamed. No fragments at all means `empty`."""
        call = self._open.pop(key, None)
        if call is None:
            why = "ended twice" if key in self._ended else "was never opened"
            return self.fail(f"block {key!r} {why}")
        self._ended.add(key)
        if call.refused:
            return []
        if call.high:
            return self._refuse(call, "invalid_unicode")
        if final is not None:
            whole = _utf8(final) if isinstance(final, str) else bytes(final)
            if whole is None:
                return self._refuse(call, "invalid_unicode")
            if call.data and bytes(call.data) != whole:
                return self._refuse(call, "stream_mismatch")
            if not call.data:
                if len(whole) > call.limit:
                    return self._refuse(call, "input_too_large")
                call.data += whole
        data = bytes(call.data) or empty
        if call.call_id in self._finished and self._finished[call.call_id] != data:
            return self._refuse(call, "call_id_reused")
        self._finished[call.call_id] = data
        return [AssembledCall(call.call_id, call.name, data, call.item_id)]

    def end_all(self, keys_first: list[Hashable] | None = None, *, code: str | None = None) -> list[Answer]:
        """End every open call (those of `keys_first` first, in that order), or, with `code`,
        refuse them with it."""
        order = [k for k in (keys_first or []) if k in self._open]
        order += [k for k in self._open if k not in order]
        answers: list[Answer] = []
        for key in order:
            if code is None:
                answers += self.end(key)
            else:
                call = self._open.pop(key)
                self._ended.add(key)
                if not call.refused:
                    answers += self._refuse(call, code)
        return answers

    def close(self) -> list[Answer]:
        """The stream ended: a call still open never finished."""
        return self.end_all(code="stream_incomplete")

    def fail(self, problem: str) -> list[Answer]:
        """A protocol violation no single call owns: the stream is broken from here on."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        self.broken = True
        return self.end_all(code="stream_broken")

    # -- inside ------------------------------------------------------------------------

    @staticmethod
    def _piece(call: _Open, fragment: str | bytes) -> bytes | None:
        """A fragment's bytes, holding back a high surrogate at its end until the next
        fragment says whether its pair follows; None for a surrogate left alone."""
        if not isinstance(fragment, str):
            return None if call.high else bytes(fragment)
        text, call.high = call.high + fragment, ""
        if text and _is_high_surrogate(text[-1]):
            text, call.high = text[:-1], text[-1]
        return _utf8(text)

    def _limit(self, name: str) -> int:
        limit = self._limit_of(name) if TOOL_NAME.fullmatch(name or "") else None
        return limit if isinstance(limit, int) and limit > 0 else self._default

    def _refuse(self, call: _Open, code: str) -> list[Answer]:
        call.refused = code
        call.data = bytearray()  # a refused call's text is never kept
        call.high = ""
        self._finished.setdefault(call.call_id, None)
        return [RefusedCall(call.call_id, call.name, code, call.item_id)]
