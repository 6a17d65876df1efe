"""Log lines as text (escaped, toolauthz/display/escape.py) or as JSON objects, one per line.

Where lines go: the start banners ("toolauthz serving bundle ...", "... metrics on ...",
"... console on ...") on standard output, through the logger `toolauthz.banner`; every
other line on standard error, through the root logger. Libraries' loggers (uvicorn's,
gRPC's, the `mcp` SDK's) have no handlers of their own and reach the root's, so with
`json` every line on both streams is one JSON object.

JSON lines (python-json-logger) carry `time` (ISO 8601, UTC), `level`, `logger`,
`message`, `worker` (the worker's index, or null in a single process), and every field
the call site gave as `extra`: a decision's `decision_id`, `tenant`, `tool`, ...; a
refused bundle's `problems` (a list, one item per problem: a multi-line error is a
field, never newlines inside a message); an exception's traceback as `exc_info`, a list
of lines. A value is a JSON string exactly as the sidecar holds it: json.dumps escapes
what JSON must and, with ensure_ascii, every non-ASCII character, so a value can neither
end its line nor hide in the terminal. Argument values are never logged unless the
decision log's allow-list names them (toolauthz/telemetry/decision_log.py).

Text lines are escaped whole (a logged value cannot split or recolour a line); a
`problems` field is appended as `; `-separated items.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter

from toolauthz.display.escape import EscapingFormatter, display

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")
BANNER_LOGGER = "toolauthz.banner"
DECISION_LOGGER = "toolauthz.decision"
# Record attributes that are not fields of a JSON line: uvicorn's `color_message` is
# its message again, with terminal colours.
_NOT_FIELDS = ("color_message",)
_OUR_HANDLER = "_toolauthz_handler"


class JsonFormatter(_LibraryJsonFormatter):
    """python-json-logger's formatter with the sidecar's field names and `worker`."""

    def __init__(self, worker: int | None = None):
        super().__init__("%(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "name": "logger"},
                         reserved_attrs=[*_LIBRARY_RESERVED, *_NOT_FIELDS], exc_info_as_array=True,
                         stack_info_as_array=True)
        self._worker = worker

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data["time"] = datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
            timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)
        log_data["worker"] = self._worker


def _library_reserved() -> list[str]:
    from pythonjsonlogger.core import RESERVED_ATTRS
    return list(RESERVED_ATTRS)


_LIBRARY_RESERVED = _library_reserved()


class TextFormatter(EscapingFormatter):
    """The escaped text line, with a record's `problems` after its message."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        problems = getattr(record, "problems", None)
        line = super().formatMessage(record)
        if problems:
            return line + ": " + "; ".join(display(str(p), quotes=False) for p in problems)
        return line


def configure_logging(log_format: str = "text", worker: int | None = None, level: str = "info",
                      decision_log: bool = False) -> None:
    """This process's logging, set whole (idempotent; the CLI configures text before it
    reads the config file, and a worker configures itself again after spawn):
    the root logger at `level` writing to standard error, the banner logger to standard
    output, the decision logger on (INFO) or off, whatever `level` is."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    root = logging.getLogger()
    root.setLevel(level.upper())
    text = TEXT_FORMAT if worker is None else TEXT_FORMAT.replace("%(name)s", f"%(name)s[{worker}]")
    _one_handler(root, sys.stderr, JsonFormatter(worker) if log_format == "json" else TextFormatter(text))
    banner = logging.getLogger(BANNER_LOGGER)
    banner.propagate = False
    banner.setLevel(logging.INFO)  # the lines that say where the sidecar serves, whatever the level
    plain = EscapingFormatter("%(message)s")
    _one_handler(banner, sys.stdout, JsonFormatter(worker) if log_format == "json" else plain)
    logging.getLogger(DECISION_LOGGER).setLevel(logging.INFO if decision_log else logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "grpc", "mcp"):
        # Their own handlers (uvicorn's default config installs some) would print a line
        # twice, once in their format: the root's handler writes it once, in ours.
        library = logging.getLogger(name)
        for handler in list(library.handlers):
            library.removeHandler(handler)
        library.propagate = True
    # uvicorn's lifecycle lines ("Started server process", one per HTTP server) say less
    # than the banner does; its warnings and errors still show.
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, root.level))
    # The HTTP client logs each request at INFO: a bundle server's poller would write a
    # line per poll; the poller's own lines say what a poll changed (remote_reload.py).
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, root.level))


def _one_handler(logger: logging.Logger, stream: Any, formatter: logging.Formatter) -> None:
    """`logger` with one stream handler, ours, on `stream`: it replaces an earlier one of
    ours and a plain one (basicConfig's); others (a test's capture) stay."""
    for handler in list(logger.handlers):
        if getattr(handler, _OUR_HANDLER, False) or type(handler) is logging.StreamHandler:
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    setattr(handler, _OUR_HANDLER, True)
    logger.addHandler(handler)


def use_log_format(log_format: str, worker: int | None = None) -> None:
    """`configure_logging` with the default level (kept for `python -m toolauthz.server.workers`)."""
    configure_logging(log_format, worker)


def banner(message: str, *args: object, **fields: Any) -> None:
    """A start line on standard output: `message % args`, with `fields` for JSON."""
    logging.getLogger(BANNER_LOGGER).info(message, *args, extra=fields)
    sys.stdout.flush()


def report_problems(summary: str, problems: list[str], log_format: str) -> None:
    """Why the sidecar cannot start, on standard error: with `text`, the problems one per
    line as they are (a person reads them, file:line first); with `json`, one line whose
    `problems` field lists them."""
    if log_format == "json":
        logging.getLogger("toolauthz").error("%s", summary, extra={"problems": problems})
        return
    for line in problems:
        print(line, file=sys.stderr, flush=True)
