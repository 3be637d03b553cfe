"""The error hierarchy of the scheduling core.

Every error the core raises on purpose derives from :class:`SchedulerCoreError`, so an adapter can
tell a bad request (answer 400, or 200 with ``Error``) from a genuine fault (answer 5xx).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

Namer = Callable[[str], str]
"""How a caller names a setting in a validation message, given the setting's path in the core's own
settings (``weights.fit``): an environment variable (a Lambda), a flag (the CLI), a CDK context key. Each
``problems(name)`` builds its messages with it, so that nothing renames them afterwards."""


def by_path(path: str) -> str:
    """The default :data:`Namer`: the core's own path (``weights.fit``)."""
    return path


class SchedulerCoreError(Exception):
    """Base class for errors raised by ``scheduler_core``."""


class InvalidArgsError(SchedulerCoreError, ValueError):
    """The request does not have the shape of the extender protocol (answer HTTP 400)."""


class InvalidPodError(SchedulerCoreError, ValueError):
    """The pod is well formed but asks for something invalid (answer 200 with ``Error``)."""


class ConfigError(SchedulerCoreError, ValueError):
    """Configuration failed validation; the message lists every problem with its field path."""


class Validatable:
    """A mix-in for settings that list every problem they have (``problems()``, each message with its
    field path): :meth:`validated` raises them all at once."""

    def problems(self) -> list[str]:
        raise NotImplementedError

    def validated(self) -> Self:
        """Return ``self``, or raise :class:`ConfigError` listing every problem."""
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))
        return self


class ClusterStateUnavailableError(SchedulerCoreError):
    """The extender needs cluster state (e.g. for ``NodeNames``) that it does not have.

    ``kind`` is a short, stable label for metrics: ``none`` (not configured), ``missing``,
    ``corrupt``, ``store_error`` or ``stale``.
    """

    def __init__(self, message: str, kind: str = "none") -> None:
        super().__init__(message)
        self.kind = kind
