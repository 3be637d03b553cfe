"""Powertools Tracer that costs nothing when tracing is off.

Constructing a Powertools ``Tracer`` imports the X-Ray SDK even when tracing is disabled, and that
import builds a botocore X-Ray client: about 300 ms of cold start on this machine
(``gpu-scheduler bench cold-start`` reports it). Where Powertools would disable tracing anyway (not
on Lambda, ``POWERTOOLS_TRACE_DISABLED``, SAM local), the tracer gets a no-op provider instead, so
the SDK is never imported.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment


class _NoSegment(BaseSegment):
    def close(self, end_time: int | None = None) -> None:
        return None

    def add_subsegment(self, subsegment: Any) -> None:
        return None

    def remove_subsegment(self, subsegment: Any) -> None:
        return None

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None:
        return None


class NoTraceProvider(BaseProvider):
    """Subsegments and annotations that record nothing (Powertools' decorators still annotate them)."""

    @contextmanager
    def in_subsegment(self, name: str | None = None, **kwargs: Any) -> Generator[BaseSegment, None, None]:
        yield _NoSegment()

    @asynccontextmanager
    async def in_subsegment_async(self, name: str | None = None, **kwargs: Any) -> AsyncGenerator[BaseSegment, None]:
        yield _NoSegment()

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def patch(self, modules: Sequence[str]) -> None:
        return None

    def patch_all(self) -> None:
        return None


def make_tracer(service: str) -> Tracer:
    """A real X-Ray tracer on Lambda with tracing on; otherwise a disabled one without the SDK."""
    if Tracer._is_tracer_disabled():
        return Tracer(service=service, disabled=True, provider=NoTraceProvider())
    return Tracer(service=service)
