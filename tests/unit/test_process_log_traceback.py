"""The process log (structlog through `decisionlog.processors`, the chain `decisionlog.configure` installs): an
event logged with an exception (``log.exception(...)``, ``exc_info=``) carries its formatted traceback as
``exception``, not ``"exc_info": true``; decision events are unchanged (`tests/unit/test_decisionlog_fused.py`)."""

from __future__ import annotations

import json
import logging
from typing import Any

import structlog

from sidecar import decisionlog


class Lines:
    def __init__(self) -> None:
        self.lines: list[Any] = []

    def msg(self, message: Any) -> None:
        self.lines.append(message)

    info = warning = error = exception = msg


def _raise_deep() -> None:
    {}["missing"]  # noqa: B018


def test_an_exception_logged_carries_its_traceback() -> None:
    for mask in ((), ("request_id",)):
        sink = Lines()
        log = structlog.wrap_logger(sink, processors=decisionlog.processors(mask),
                                    wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
        try:
            _raise_deep()
        except KeyError:
            log.exception("pipeline_error", request_id="r1")
        try:
            _raise_deep()
        except KeyError as exc:
            log.warning("reconcile_failed", exc_info=exc)
        for line in sink.lines:
            event = json.loads(line)
            assert "exc_info" not in event
            assert event["exception"].startswith("Traceback (most recent call last):")
            assert "_raise_deep" in event["exception"] and "KeyError: 'missing'" in event["exception"]
        log.info("plain", n=1)
        assert "exception" not in json.loads(sink.lines[-1])
