"""Lambda settings from environment variables, read once into a frozen dataclass.

Each setting is declared once, with :func:`setting`: its field, its environment variable, its default
and its doc (and, where a command line or the CDK app sets it, its flag and its context key).
:func:`load_settings` parses the variables by the fields' annotated types and collects every problem,
so a bad deployment fails at start-up with one message that names each variable and value. From the
same declaration, :func:`settings_table` writes the reference table in ``docs/configuration.md`` (a
test fails when the two drift), :func:`add_flags` makes a command's flags (``gpu-scheduler serve``'s),
and :func:`environment` the variables the CDK app gives a Lambda.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Self, TypeVar

from scheduler_core.errors import ConfigError, Namer

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


def setting(
    env: str, default: Any, doc: str, *, shown: str | None = None, flag: str | None = None, context: str | None = None
) -> Any:
    """A settings field read from ``env``; ``doc`` is its line in the reference table, where the default
    reads ``shown`` when the value itself would not help (a long template, say). ``flag`` is its
    command-line flag where that is not the field's name (:func:`flag_name`); ``context`` its CDK context
    key, for a setting the deployment passes on (:func:`environment`)."""
    metadata = {"env": env, "doc": doc, "shown": shown, "flag": flag, "context": context}
    return field(default=default, metadata=metadata)


def _field(cls: type, name: str) -> Field[Any]:
    return next(f for f in fields(cls) if f.name == name)


def env_name(cls: type, name: str) -> str:
    """The environment variable of field ``name`` of settings class ``cls``."""
    return str(_field(cls, name).metadata["env"])


def flag_name(cls: type, name: str) -> str:
    """The command-line flag of field ``name``: its declared ``flag``, else ``--`` and the name with dashes."""
    return str(_field(cls, name).metadata.get("flag") or "--" + name.replace("_", "-"))


def env_names(cls: type) -> Namer:
    """Name each field of ``cls`` by its environment variable (the Lambdas' validation)."""
    return lambda name: env_name(cls, name)


def flag_names(cls: type) -> Namer:
    """Name each field of ``cls`` by its flag (the CLI's validation)."""
    return lambda name: flag_name(cls, name)


def context_names(cls: type) -> Namer:
    """Name each field of ``cls`` by its CDK context key, where it declares one, else by its variable (the CDK
    app's validation).

    >>> @dataclass
    ... class S:
    ...     max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse older", context="maxAgeS")
    ...     other: str = setting("OTHER", "", "not the deployment's")
    >>> [context_names(S)(name) for name in ("max_age_s", "other")]
    ['maxAgeS', 'OTHER']
    """
    keys = context_keys(cls)
    return lambda name: keys.get(name) or env_name(cls, name)


def default_of(cls: type, name: str) -> Any:
    """The declared default of field ``name`` of settings class ``cls``."""
    return _field(cls, name).default


def add_flags(
    parser: Any, cls: type, names: Iterable[str], *, defaults: Mapping[str, Any] | None = None, from_env: bool = False
) -> None:
    """A flag for each field ``names`` of settings class ``cls`` on ``parser`` (or an argument group):
    :func:`flag_name`, parsed by the field's annotated type, its doc and its default as the help.

    The parsed value is None unless the flag is given (:func:`given`): the settings class keeps the one
    default. ``defaults`` shows a command's own default, where it differs from the deployment's (it is the
    command's to pass); ``from_env`` says in the help that the field's variable is read when it is unset.

    >>> @dataclass
    ... class S:
    ...     max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse older")
    >>> parser = argparse.ArgumentParser()
    >>> add_flags(parser, S, ["max_age_s"])
    >>> given(parser.parse_args(["--max-age-s", "60"]), ["max_age_s"]), given(parser.parse_args([]), ["max_age_s"])
    ({'max_age_s': 60.0}, {})
    """
    defaults = defaults or {}
    for name in names:
        f = _field(cls, name)
        shown = str(defaults[name]) if name in defaults else _shown(f)
        notes = ([] if shown == "(none)" else [f"default {shown}"]) + ([f"${f.metadata['env']}"] if from_env else [])
        text = flags_in_help(cls, str(f.metadata["doc"])) + (f" ({'; '.join(notes)})" if notes else "")
        text = text.replace("`", "").replace("%", "%%")  # Markdown in the docs; argparse formats %
        if str(f.type) == "bool":  # --x and --no-x: a default of true can be turned off
            parser.add_argument(
                flag_name(cls, name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            parser.add_argument(flag_name(cls, name), dest=name, type=_flag_type(f), default=None, help=text)


def _flag_type(f: Field[Any]) -> Callable[[str], Any]:
    parse = _PARSERS[str(f.type)]

    def convert(raw: str) -> Any:
        try:
            return parse(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {f.type}, got {raw!r}") from None

    return convert


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The fields ``names`` whose flag (:func:`add_flags`) was given, with their values."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def flags_in_help(cls: type, text: str) -> str:
    """A field's doc, for its flag's help, with each variable it mentions written as that field's flag
    (a doc says "instead of `CLUSTER_NAME`"; ``--help`` says "instead of `--cluster-name`"). Help text
    only: validation names each setting as its caller does (:data:`Namer`).

    >>> @dataclass
    ... class S:
    ...     max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse older")
    >>> flags_in_help(S, "with MAX_AGE_S set")
    'with --max-age-s set'
    """
    by_env = {env_name(cls, f.name): flag_name(cls, f.name) for f in fields(cls)}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(by_env, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda match: by_env[match[1]], text)


def environment(cls: type, source: object) -> dict[str, str]:
    """The variables of settings class ``cls`` whose fields declare a ``context`` key, with the values of
    the attributes of the same names on ``source`` (the CDK app's ``DeployConfig``): a Lambda's environment.

    >>> @dataclass
    ... class S:
    ...     max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse older", context="maxAgeS")
    ...     other: str = setting("OTHER", "", "not the deployment's")
    >>> environment(S, S(max_age_s=60))
    {'MAX_AGE_S': '60'}
    """
    found = {}
    for name in context_keys(cls):
        found[env_name(cls, name)] = _env_value(getattr(source, name))
    return found


def _env_value(value: Any) -> str:
    """A value as its variable holds it: ``true``/``false``, a whole number without ``.0``.

    >>> [_env_value(v) for v in (True, 240.0, 0.5, 7, "x")]
    ['true', '240', '0.5', '7', 'x']
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def context_keys(cls: type) -> dict[str, str]:
    """Field name to CDK context key, for the fields of ``cls`` that declare one."""
    return {f.name: str(f.metadata["context"]) for f in fields(cls) if f.metadata.get("context")}


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


def load_settings(
    cls: type[T], environ: Mapping[str, str] | None, overrides: Mapping[str, Any], named_by: Namer | None = None
) -> T:
    """Build ``cls`` from the environment, or raise :class:`ConfigError` naming every bad setting: a variable
    that does not parse by its name, the rest by ``named_by`` (:func:`env_names` by default; the CLI passes
    :func:`flag_names` for the values its flags gave).

    ``cls`` has a ``problems(name)`` method for the checks that span fields.
    """
    values, problems = read_env(cls, environ, overrides)
    settings = cls(**values)
    problems += settings.problems(named_by or env_names(cls))  # type: ignore[attr-defined]
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
    kube_api_url: str = setting(
        "KUBE_API_URL", "", "instead of `CLUSTER_NAME`: an API server URL (local runs)", flag="--kube-url"
    )
    kube_token: str = setting("KUBE_TOKEN", "", "with `KUBE_API_URL`: its bearer token")
    kubeconfig: str = setting("KUBECONFIG", "", "instead of both: a kubeconfig file (local runs)")
    region: str = setting("AWS_REGION", "", "the AWS region (the Lambda runtime sets it)")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, named_by: Namer | None = None, **overrides: Any
    ) -> Self:
        """The settings from ``environ`` (``os.environ`` when None); an explicit keyword argument wins over
        it. Raises :class:`ConfigError` listing every invalid setting with its value, named by ``named_by``
        (:func:`load_settings`), at start-up.

        >>> ClusterAccess.from_env({"KUBE_API_URL": "https://127.0.0.1:6443"}).kube_api_url
        'https://127.0.0.1:6443'
        """
        return load_settings(cls, environ, overrides, named_by)

    def problems(self, name: Namer | None = None) -> list[str]:
        """Every invalid setting, each named by ``name`` of its field (its variable by default)."""
        return self.access_problems(name)

    def access_problems(self, name: Namer | None = None) -> list[str]:
        if self.cluster_name or self.kube_api_url or self.kubeconfig:
            return []
        name = name or env_names(type(self))
        needed = f"{name('cluster_name')}: required, unless {name('kube_api_url')} or {name('kubeconfig')}"
        return [f"{needed} says where the API is"]

    def connect(self, session: Any) -> Any:
        from adapters.kube import connect

        return connect(
            cluster_name=self.cluster_name,
            api_url=self.kube_api_url,
            token=self.kube_token,
            kubeconfig=self.kubeconfig,
            session=session,
        )
