"""Lambda settings from environment variables, read once into a frozen dataclass.

Each setting is declared once, with :func:`setting`: its field, its environment variable, its default
and its doc. :func:`load_settings` parses the variables by the fields' annotated types and collects
every problem, so a bad deployment fails at start-up with one message that names each variable and
value; :func:`settings_table` writes the reference table in ``docs/configuration.md`` from the same
declaration (a test fails when the two drift).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
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


def setting(env: str, default: Any, doc: str, *, shown: str | None = None) -> Any:
    """A settings field read from ``env``; ``doc`` is its line in the reference table, where the default
    reads ``shown`` when the value itself would not help (a long template, say)."""
    return field(default=default, metadata={"env": env, "doc": doc, "shown": shown})


def env_name(cls: type, name: str) -> str:
    """The environment variable of field ``name`` of settings class ``cls``."""
    return str(next(f for f in fields(cls) if f.name == name).metadata["env"])


def read_env(
    cls: type, environ: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Values for the fields of settings class ``cls`` that are set, and the problems found.

    An explicit override wins over the environment; an unset or empty variable keeps the default.

    >>> @dataclass
    ... class S:
    ...     dry_run: bool = setting("DRY_RUN", False, "plan, write nothing")
    ...     limit: int = setting("LIMIT", 5, "at most this many")
    >>> read_env(S, {"DRY_RUN": "yes", "LIMIT": "x"}, {})
    ({'dry_run': True}, ["LIMIT: expected int, got 'x'"])
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[str] = []
    for f in fields(cls):
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        variable = f.metadata["env"]
        raw = env.get(variable, "")
        if raw:
            try:
                values[f.name] = _PARSERS[str(f.type)](raw)
            except ValueError:
                problems.append(f"{variable}: expected {f.type}, got {raw!r}")
    return values, problems


def load_settings(cls: type[T], environ: Mapping[str, str] | None, overrides: Mapping[str, Any]) -> T:
    """Build ``cls`` from the environment, or raise :class:`ConfigError` naming every bad variable.

    ``cls`` has a ``problems()`` method for the checks that span fields.
    """
    values, problems = read_env(cls, environ, overrides)
    settings = cls(**values)
    problems += settings.problems()  # type: ignore[attr-defined]
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def settings_table(cls: type) -> str:
    """The Markdown reference table of ``cls``: variable, default and meaning, in field order.

    >>> @dataclass
    ... class S:
    ...     limit: int = setting("LIMIT", 5, "at most this many")
    >>> print(settings_table(S))
    | variable | default | meaning |
    |---|---|---|
    | `LIMIT` | 5 | at most this many |
    """
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{f.metadata['env']}` | {_shown(f)} | {f.metadata['doc']} |" for f in fields(cls)]
    return "\n".join(lines)


def _shown(f: Field[Any]) -> str:
    if f.metadata.get("shown") is not None:
        return str(f.metadata["shown"])
    default = f.default
    if default is MISSING or default == "":
        return "(none)"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)


@dataclass(frozen=True)
class ClusterAccess:
    """Where the Kubernetes API is, for the refreshers and the extender's bind (see :func:`adapters.kube.connect`)."""

    cluster_name: str = setting(
        "CLUSTER_NAME", "", "the EKS cluster: endpoint and CA from `DescribeCluster`, IAM token from STS"
    )
    kube_api_url: str = setting("KUBE_API_URL", "", "instead of `CLUSTER_NAME`: an API server URL (local runs)")
    kube_token: str = setting("KUBE_TOKEN", "", "with `KUBE_API_URL`: its bearer token")
    kubeconfig: str = setting("KUBECONFIG", "", "instead of both: a kubeconfig file (local runs)")
    region: str = setting("AWS_REGION", "", "the AWS region (the Lambda runtime sets it)")

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
