"""What the two refresher Lambdas share (``node_state``, ``deletion_cost``): one run of their service in the
time the invocation has left, its one log line, and its report as the function's result. Each handler
keeps its own metrics (its ``emit``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext


def run_refresher(
    refresh: Callable[..., Any],
    settings: Any,
    services: Any,
    context: LambdaContext,
    *,
    emit: Callable[[Any], None],
    logger: Logger,
    what: str,
) -> dict[str, Any]:
    """``refresh(settings, services, ...)`` until the invocation's deadline; its metrics (``emit``), its log
    line (``what`` with the whole report: INFO when it went well, ERROR otherwise), and the report."""
    report = refresh(settings, services, time_left=lambda: context.get_remaining_time_in_millis() / 1000, logger=logger)
    emit(report)
    (logger.info if report.status == "ok" else logger.error)(what, extra={"report": asdict(report)})
    return asdict(report)
