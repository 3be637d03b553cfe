"""Lambda settings from environment variables, read once into a frozen dataclass.

Each Lambda's settings class maps its fields to variable names; :func:`read_env` parses the values
by the fields' annotated types and collects every problem, so a bad deployment fails at start-up
with one message that names each variable and value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from scheduler_core.errors import ConfigError

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(raw: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); ValueError otherwise."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(raw)


_PARSERS: dict[str, Callable[[str], Any]] = {"float": float, "int": int, "str": str, "bool": parse_bool}


def read_env(
    cls: type, names: Mapping[str, str], environ: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Values for the fields of dataclass ``cls`` that are set, and the problems found.

    An explicit override wins over the environment; an unset or empty variable keeps the default.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class S:
    ...     dry_run: bool = False
    ...     limit: int = 5
    >>> read_env(S, {"dry_run": "DRY_RUN", "limit": "LIMIT"}, {"DRY_RUN": "yes", "LIMIT": "x"}, {})
    ({'dry_run': True}, ["LIMIT: expected int, got 'x'"])
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[str] = []
    for f in fields(cls):
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        raw = env.get(names[f.name], "")
        if raw:
            try:
                values[f.name] = _PARSERS[str(f.type)](raw)
            except ValueError:
                problems.append(f"{names[f.name]}: expected {f.type}, got {raw!r}")
    return values, problems


def load_settings(
    cls: type[T], names: Mapping[str, str], environ: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> T:
    """Build ``cls`` from the environment, or raise :class:`ConfigError` naming every bad variable.

    ``cls`` has a ``problems()`` method for the checks that span fields.
    """
    values, problems = read_env(cls, names, environ, overrides)
    settings = cls(**values)
    problems += settings.problems()  # type: ignore[attr-defined]
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


CLUSTER_ACCESS_ENV = {
    "cluster_name": "CLUSTER_NAME",
    "kube_api_url": "KUBE_API_URL",
    "kube_token": "KUBE_TOKEN",
    "kubeconfig": "KUBECONFIG",
    "region": "AWS_REGION",
}


@dataclass(frozen=True)
class ClusterAccess:
    """Where the Kubernetes API is, for the refreshers (see :func:`adapters.kube.connect`)."""

    cluster_name: str = ""
    kube_api_url: str = ""
    kube_token: str = ""
    kubeconfig: str = ""
    region: str = ""

    def access_problems(self) -> list[str]:
        if self.cluster_name or self.kube_api_url or self.kubeconfig:
            return []
        return ["CLUSTER_NAME: required, unless KUBE_API_URL or KUBECONFIG says where the API is"]

    def connect(self, session: Any) -> Any:
        from adapters.kube import connect

        return connect(
            cluster_name=self.cluster_name,
            api_url=self.kube_api_url,
            token=self.kube_token,
            kubeconfig=self.kubeconfig,
            session=session,
        )
