"""Structured logging: one JSON object per line (for log pipelines) or ``key=value`` text (for
people at a terminal), chosen once at start-up. Call sites pass fields with ``extra={"fields": {...}}``
through the ``log`` helper so every line carries the model, pool, reason code and numbers.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {}) or {}
        kv = " ".join(f"{k}={v}" for k, v in fields.items())
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        line = f"{ts} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if kv:
            line += " " + kv
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


HTTP_CLIENT_LOGGERS = ("httpx", "httpcore", "urllib3", "requests", "prometheus_api_client")
"""Loggers of the HTTP client libraries the providers use, kept at WARNING unless the level is DEBUG."""


def setup(fmt: str = "json", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log is noisy at demo speed; errors still show
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # "skipped: maximum number of running instances reached" is the coalescing working as meant
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    # HTTP clients log every request (httpx at INFO: one line per Prometheus query, ~170k a day);
    # they speak only at DEBUG, where a person asked for that detail
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(quiet)


def log(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    logger.log(level, msg, extra={"fields": fields})
