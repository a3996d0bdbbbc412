"""Log lines for machines (one JSON object a line) or people; fields ride in `extra={"fields": {...}}`."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime


def _fields(record: logging.LogRecord) -> dict:
    return getattr(record, "fields", {})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(f"{key}={value}" for key, value in _fields(record).items())
        return f"{super().format(record)} {pairs}".rstrip()


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
