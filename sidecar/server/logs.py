"""Log lines as text (escaped, sidecar/display.py) or as JSON objects, one per line.

JSON lines carry `time` (ISO 8601, UTC), `level`, `logger`, `message`, `worker` (the
worker's index, or null in a single process), and when the line is about one call its
`decision_id`, `request_id`, `call_id`, `tool` and `result` (from the record's `extra`).
A value is a JSON string exactly as the sidecar holds it: json.dumps escapes what JSON
must (quotes, backslashes, control characters) and, with ensure_ascii, every non-ASCII
character, so a value can neither end its line nor hide in the terminal. Nothing else
is escaped, so a parser reads back the original value. Argument values are never
logged: the call's fields above are ids and vocabularies.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

from sidecar.display import use_escaping_formatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CALL_FIELDS = ("decision_id", "request_id", "call_id", "tool", "result")


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None):
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "worker": self._worker}
        for name in CALL_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=True)


def use_log_format(log_format: str, worker: int | None = None) -> None:
    """The root logger's format for this process: `text` or `json`. Replaces the
    handlers' formatter when logging was configured already (the CLI configures text
    before it reads the config file)."""
    text = TEXT_FORMAT if worker is None else TEXT_FORMAT.replace("%(name)s", f"%(name)s[{worker}]")
    use_escaping_formatter(logging.INFO, text)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter(worker))
