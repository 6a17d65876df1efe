"""What the gateway passes through without a decision: progress, log messages, the
logging level, completions, each upstream's instructions and tool annotations.

* Progress: a `tools/call` whose client sent a `progressToken` gets the upstream's
  progress notifications for that call, under the client's token. The relay rides a
  context variable set for the call, so a notification only ever reaches the request
  that caused it.
* Log messages (`notifications/message`): one upstream connection serves every user of
  the gateway, and a message names no request, so messages are passed on only over
  stdio (one client, the configured identity); over HTTP they are logged here instead.
* `logging/setLevel` is sent to every connected upstream.
* `completion/complete` goes to the upstream of a catalogued, still pinned prompt or
  resource template (by the catalog's prompt name, or the template's URI); anything else
  gets no values.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import mcp_types as types

from toolauthz.display.escape import display
from toolauthz.mcp_proxy.pins import PinnedTool
from toolauthz.mcp_proxy.upstreams import UpstreamLink, UpstreamUnavailable

__all__ = ["progress_relay", "relaying_progress", "LogRelay", "instructions_of", "annotations_of",
           "EMPTY_COMPLETION"]

log = logging.getLogger("toolauthz.mcp_proxy")
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
_progress: ContextVar[ProgressFn | None] = ContextVar("toolauthz_mcp_progress", default=None)
EMPTY_COMPLETION = types.CompleteResult(completion=types.Completion(values=[]))


def progress_relay() -> ProgressFn | None:
    """The current call's relay to its client, or None when the client asked for none."""
    return _progress.get()


@contextlib.contextmanager
def relaying_progress(ctx: Any, token: str | int | None) -> Iterator[None]:
    """Within it (and in tasks started within it), upstream progress goes to `ctx`'s
    client under its own `token`."""
    if token is None:
        yield
        return

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        try:
            await ctx.session.send_progress_notification(token, progress, total=total, message=message,
                                                         related_request_id=ctx.request_id)
        except Exception:  # logged; progress is a courtesy, the call goes on without it
            log.debug("could not relay a progress notification", exc_info=True)

    reset = _progress.set(relay)
    try:
        yield
    finally:
        _progress.reset(reset)


class LogRelay:
    """Passes upstream log messages to the stdio client (see the module docstring)."""

    def __init__(self, forward: bool):
        self.forward = forward
        self.session: Any = None  # the stdio client's session, once it sent a request
        self.subscribed: set[str] = set()  # the URIs the stdio client subscribed to (updates of others are dropped)

    def callback_for(self, upstream: str) -> Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]:
        async def on_message(params: types.LoggingMessageNotificationParams) -> None:
            logger = f"{upstream}/{params.logger}" if params.logger else upstream
            session = self.session
            if not self.forward or session is None:
                log.info("upstream %s logged at %s", display(logger), params.level)
                return
            try:
                with warnings.catch_warnings():  # deprecated as of 2026-07-28, still 2025-11-25's way
                    warnings.simplefilter("ignore")
                    await session.send_log_message(level=params.level, data=params.data, logger=logger)
            except Exception:  # logged; a lost log message never fails a call
                log.debug("could not pass on a log message", exc_info=True)

        return on_message

    async def resource_updated(self, uri: str) -> None:
        """An upstream's `notifications/resources/updated`, to the stdio client."""
        session = self.session
        if not self.forward or session is None or uri not in self.subscribed:
            return
        try:
            await session.send_resource_updated(uri)
        except Exception:  # logged; a lost update never fails anything
            log.debug("could not pass on a resource update", exc_info=True)


async def set_level_everywhere(links: Mapping[str, UpstreamLink], level: types.LoggingLevel) -> None:
    for link in links.values():
        try:
            with warnings.catch_warnings():  # deprecated as of 2026-07-28, still 2025-11-25's way
                warnings.simplefilter("ignore")
                await link.client.session.set_logging_level(level=level)
        except UpstreamUnavailable:
            continue
        except Exception:  # logged; an upstream without logging keeps its level
            log.info("upstream %s did not take the logging level", display(link.spec.name), exc_info=True)


def instructions_of(links: Mapping[str, UpstreamLink]) -> str | None:
    """Each connected upstream's `instructions`, under its name (several servers' texts
    in one: the client must know which server each sentence is about)."""
    parts = []
    for name, link in links.items():
        try:
            text = link.client.instructions
        except UpstreamUnavailable:
            continue
        if text:
            parts.append(f"[{name}]\n{text}" if len(links) > 1 else text)
    return "\n\n".join(parts) or None


def annotations_of(pinned: PinnedTool, advertised: types.Tool | None) -> types.ToolAnnotations | None:
    """The upstream's annotations (every hint), never less careful than the catalog's
    `side_effect`: a tool the catalog says writes is not read-only, and one that deletes
    or updates is destructive, whatever the upstream says."""
    hints = advertised.annotations.model_copy() if advertised is not None and advertised.annotations else None
    if pinned.side_effect == "read":
        return hints or types.ToolAnnotations(read_only_hint=True)
    hints = hints or types.ToolAnnotations()
    hints.read_only_hint = False
    if pinned.side_effect in ("delete", "update"):
        hints.destructive_hint = True
    return hints


async def complete(catalog: Any, prompts: Mapping[str, Any], templates: Mapping[str, Any],
                   params: types.CompleteRequestParams) -> types.CompleteResult:
    """Routes a completion to the upstream of its catalogued prompt or template."""
    ref = params.ref
    pinned: PinnedTool | None = None
    if isinstance(ref, types.PromptReference) and ref.name in prompts:
        pinned = catalog.pins[ref.name]
        ref = types.PromptReference(name=pinned.upstream_name)
    elif isinstance(ref, types.ResourceTemplateReference):
        names = [name for name in templates if catalog.pins[name].uri == ref.uri]
        pinned = catalog.pins[names[0]] if names else None
    link = catalog.upstream_of(pinned.name) if pinned is not None else None
    if link is None:
        return EMPTY_COMPLETION
    context = params.context.arguments if params.context is not None else None
    try:
        answer: types.CompleteResult = await link.client.complete(
            ref, {"name": params.argument.name, "value": params.argument.value}, context_arguments=context)
        return answer
    except Exception:  # logged; no suggestions is a complete answer
        log.info("upstream %s gave no completion", display(link.spec.name), exc_info=True)
        return EMPTY_COMPLETION
