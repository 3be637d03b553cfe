"""Required node affinity, as kube-scheduler's NodeAffinity filter evaluates it.

``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``
(``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``):

- the terms are ORed: a node matches when one term matches it; no term, no match;
- a term with neither ``matchExpressions`` nor ``matchFields`` matches no node, and a term that does
  not parse (an unknown operator, ``In`` without values, ``Gt`` on a value that is not an int64...)
  matches no node either, while the other terms still count;
- within a term, every expression must hold (they are ANDed), and so must every field;
- on labels: ``In`` and ``NotIn`` (a node without the label is *not in*), ``Exists``,
  ``DoesNotExist``, and ``Gt``/``Lt``, which compare the label and the one value as base-10 int64
  (a node whose label is absent or not an integer does not match either);
- on fields: only ``metadata.name``, with ``In`` or ``NotIn`` and exactly one value. A node without a
  name skips the fields, as Go does (``extractNodeFields``).

The pod's ``nodeSelector`` is ANDed with all of it; it is checked where the nodeSelector is
(:mod:`scheduler_core.extender.admission`). Label keys and values are not re-validated as label syntax:
the API server did that when it admitted the pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.names import GFD_PRODUCT, KARPENTER_GPU_NAME, LABEL_MODEL

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
NAME_FIELD = "metadata.name"
_INT64 = re.compile(r"[+-]?[0-9]+", re.ASCII)  # strconv.ParseInt(s, 10, 64): no spaces, no underscores
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_SHOWN = 8  # values of one expression shown in a reason


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` or ``matchFields`` entry: ``key operator values``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        shown = ", ".join(self.values[:_MAX_SHOWN]) + (", ..." if len(self.values) > _MAX_SHOWN else "")
        return f"{self.key} {self.operator} [{shown}]"


@dataclass(frozen=True)
class SelectorTerm:
    """One ``nodeSelectorTerms`` entry. ``problem`` says why it does not parse ('' when it does); such a
    term matches no node."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()
    problem: str = ""


@dataclass(frozen=True)
class RequiredAffinity:
    """A pod's required node affinity: its terms, ORed."""

    terms: tuple[SelectorTerm, ...]


def required_affinity(pod: Mapping[str, Any]) -> RequiredAffinity | None:
    """The pod's required node affinity, or None when it has none (every node matches).

    Parameters
    ----------
    pod : v1 Pod object (a mapping), as the API server returns it

    Returns
    -------
    RequiredAffinity or None

    Examples
    --------
    >>> pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    ...     "nodeSelectorTerms": [{"matchExpressions": [
    ...         {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1b"]}]}]}}}}}
    >>> [str(r) for r in required_affinity(pod).terms[0].expressions]
    ['topology.kubernetes.io/zone NotIn [us-east-1b]']
    >>> required_affinity({"spec": {}}) is None
    True
    """
    spec = _mapping(pod.get("spec"))
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    selector = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if selector is None:
        return None
    terms = _mapping(selector).get("nodeSelectorTerms")
    items = terms if isinstance(terms, list) else []
    return RequiredAffinity(tuple(_term(item, i) for i, item in enumerate(items)))


def match_nodes(
    affinity: RequiredAffinity | None, names: Sequence[str], labels: Sequence[Mapping[str, Any]]
) -> npt.NDArray[np.bool_]:
    """Which nodes the required affinity admits.

    Parameters
    ----------
    affinity : RequiredAffinity or None
        From :func:`required_affinity`; None admits every node.
    names : sequence of str, length n_nodes
        The nodes' ``metadata.name``.
    labels : sequence of mappings, length n_nodes
        The nodes' ``metadata.labels`` (entries that are not strings count as absent).

    Returns
    -------
    ndarray of shape (n_nodes,), bool

    Raises
    ------
    ValueError
        When ``names`` and ``labels`` differ in length.

    Examples
    --------
    >>> pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    ...     "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]},
    ...                           {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]}}}}}
    >>> match_nodes(required_affinity(pod), ["a", "b", "c"], [{"gpus": "8"}, {"gpus": "2"}, {}]).tolist()
    [True, False, True]
    """
    if len(names) != len(labels):
        raise ValueError(f"names and labels: expected the same length, got {len(names)} and {len(labels)}")
    if affinity is None:
        return np.ones(len(names), dtype=np.bool_)
    return _compute_match(affinity, _NodeColumns(names, labels))


def unmet(affinity: RequiredAffinity | None, name: str, labels: Mapping[str, Any]) -> list[str]:
    """Why one node is not admitted: for each term, the first expression or field it fails (or why the
    term never matches); empty when the node is admitted. Only the pod's own terms are named, never the
    node's label values.

    >>> pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    ...     "nodeSelectorTerms": [{"matchExpressions": [
    ...         {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["us-east-1b"]}]}]}}}}}
    >>> unmet(required_affinity(pod), "n", {"topology.kubernetes.io/zone": "us-east-1b"})
    ['topology.kubernetes.io/zone NotIn [us-east-1b]']
    >>> unmet(required_affinity(pod), "n", {"topology.kubernetes.io/zone": "us-east-1a"})
    []
    """
    if affinity is None:
        return []
    columns = _NodeColumns([name], [labels])
    if _compute_match(affinity, columns)[0]:
        return []
    reasons = []
    for term in affinity.terms:
        if term.problem:
            reasons.append(f"a term that matches no node ({term.problem})")
            continue
        failed = [r for r in term.expressions if not _label_mask(r, columns)[0]]
        if term.fields and columns.has_name[0]:
            failed += [r for r in term.fields if not _field_mask(r, columns)[0]]
        reasons.append(str(failed[0]) if failed else "a term that matches no node")
    return reasons or ["no nodeSelectorTerms"]


MODEL_KEYS = (KARPENTER_GPU_NAME, LABEL_MODEL, GFD_PRODUCT)
"""The node labels that name a node's GPU model: Karpenter's (``h100``), the product's (``H100``) and GFD's
(``NVIDIA-H100-80GB-HBM3``), each read through :func:`~scheduler_core.k8s.gpu_models.normalize_model`."""


def affinity_models(affinity: RequiredAffinity | None) -> frozenset[str] | None:
    """The GPU models the required node affinity allows, by ``In`` on a :data:`MODEL_KEYS` label: for each
    term, the models every such expression of it allows; over the terms (ORed), their union. None when
    some term constrains no model, or there is no affinity or no term that parses: any model then, as
    far as models go. Other operators (``NotIn``, ``Exists``...) and terms that do not parse (which match
    no node) are the affinity check's to apply, kube-scheduler's and the bind's.

    >>> pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    ...     "nodeSelectorTerms": [
    ...         {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In",
    ...                                "values": ["h100", "a100"]}]},
    ...         {"matchExpressions": [{"key": "gpu.nvidia.com/model", "operator": "In", "values": ["H200"]}]}]}}}}}
    >>> sorted(affinity_models(required_affinity(pod)))
    ['A100', 'H100', 'H200']
    """
    if affinity is None or all(term.problem for term in affinity.terms):
        return None
    allowed: set[str] = set()
    for term in affinity.terms:
        if term.problem:
            continue
        in_term: set[str] | None = None
        for requirement in term.expressions:
            if requirement.key in MODEL_KEYS and requirement.operator == "In":
                models = {m for m in map(normalize_model, requirement.values) if m is not None}
                in_term = models if in_term is None else in_term & models
        if in_term is None:
            return None
        allowed |= in_term
    return frozenset(allowed)


class _NodeColumns:
    """The nodes' label values, one integer-coded column per key, built on first use: each expression
    is then a few array operations over all nodes."""

    def __init__(self, names: Sequence[str], labels: Sequence[Mapping[str, Any]]) -> None:
        self.names = list(names)
        self.labels = labels
        self.n_nodes = len(self.names)
        # Go reads the fields only when the node has a name (extractNodeFields): all of ours have one
        # unless built by hand, so a nameless node skips matchFields as it would in kube-scheduler.
        self.has_name = np.array([bool(n) for n in self.names], dtype=np.bool_)
        self._columns: dict[str, tuple[npt.NDArray[np.int64], list[str]]] = {}

    def column(self, key: str) -> tuple[npt.NDArray[np.int64], list[str]]:
        """``codes`` of shape (n_nodes,), int64 (-1: no such label), and the values they index."""
        found = self._columns.get(key)
        if found is None:
            vocabulary: dict[str, int] = {}
            codes = np.full(self.n_nodes, -1, dtype=np.int64)
            for row, labels in enumerate(self.labels):
                value = labels.get(key) if isinstance(labels, Mapping) else None
                if isinstance(value, str):
                    codes[row] = vocabulary.setdefault(value, len(vocabulary))
            found = self._columns[key] = (codes, list(vocabulary))
        return found


def _compute_match(affinity: RequiredAffinity, columns: _NodeColumns) -> npt.NDArray[np.bool_]:
    matched = np.zeros(columns.n_nodes, dtype=np.bool_)
    for term in affinity.terms:
        if term.problem or not (term.expressions or term.fields):
            continue  # matches no node
        mask = np.ones(columns.n_nodes, dtype=np.bool_)
        for requirement in term.expressions:
            mask &= _label_mask(requirement, columns)
        for requirement in term.fields:
            mask &= _field_mask(requirement, columns) | ~columns.has_name
        matched |= mask
    return matched


def _label_mask(requirement: Requirement, columns: _NodeColumns) -> npt.NDArray[np.bool_]:
    """Shape (n_nodes,): the nodes whose labels satisfy one (valid) expression."""
    codes, vocabulary = columns.column(requirement.key)
    present = codes >= 0
    operator = requirement.operator
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return ~present
    if operator in ("In", "NotIn"):
        wanted = set(requirement.values)
        hits = np.array([value in wanted for value in vocabulary], dtype=np.bool_)
        member = present & hits[np.maximum(codes, 0)] if hits.size else np.zeros(columns.n_nodes, dtype=np.bool_)
        return member if operator == "In" else ~member
    # Gt, Lt: the node's label as an int64; a label that is absent or not one matches neither.
    if not vocabulary:
        return np.zeros(columns.n_nodes, dtype=np.bool_)
    bound = _parse_int64(requirement.values[0])
    assert bound is not None  # checked when the term was read
    parsed = [_parse_int64(value) for value in vocabulary]  # one parse per distinct value, not per node
    numeric = np.array([p is not None for p in parsed], dtype=np.bool_)
    numbers = np.array([p if p is not None else 0 for p in parsed], dtype=np.int64)
    at = np.maximum(codes, 0)  # -1 (absent) reads entry 0, then is masked out by ``present``
    compared = numbers[at] > bound if operator == "Gt" else numbers[at] < bound
    result: npt.NDArray[np.bool_] = present & numeric[at] & compared
    return result


def _field_mask(requirement: Requirement, columns: _NodeColumns) -> npt.NDArray[np.bool_]:
    """Shape (n_nodes,): the nodes whose fields satisfy one (valid) ``matchFields`` entry. A key other
    than ``metadata.name`` reads as "" (Go's ``fields.Set.Get``); the API server admits no other key."""
    field = np.array(columns.names, dtype=object) if requirement.key == NAME_FIELD else np.full(columns.n_nodes, "")
    equal: npt.NDArray[np.bool_] = np.asarray(field == requirement.values[0], dtype=np.bool_)
    return equal if requirement.operator == "In" else ~equal


def _term(item: object, index: int) -> SelectorTerm:
    """Read one term; a term that does not parse carries the first problem found."""
    term = _mapping(item)
    expressions: list[Requirement] = []
    fields: list[Requirement] = []
    for section, target, operators in (
        ("matchExpressions", expressions, LABEL_OPERATORS),
        ("matchFields", fields, FIELD_OPERATORS),
    ):
        entries = term.get(section) or []
        if not isinstance(entries, list):
            return SelectorTerm(problem=f"nodeSelectorTerms[{index}].{section}: expected a list")
        for position, entry in enumerate(entries):
            where = f"nodeSelectorTerms[{index}].{section}[{position}]"
            requirement, problem = _requirement(entry, operators, section == "matchFields")
            if problem:
                return SelectorTerm(problem=f"{where}: {problem}")
            assert requirement is not None
            target.append(requirement)
    return SelectorTerm(tuple(expressions), tuple(fields))


def _requirement(entry: object, operators: tuple[str, ...], field: bool) -> tuple[Requirement | None, str]:
    """One expression, checked as ``labels.NewRequirement`` (or the field selector) checks it."""
    if not isinstance(entry, Mapping):
        return None, "expected an object"
    key, operator, values = entry.get("key"), entry.get("operator"), entry.get("values") or []
    if not isinstance(key, str):
        return None, "key: expected a string"
    if operator not in operators:
        return None, f"operator {str(operator)[:32]!r} is not one of {', '.join(operators)}"
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None, "values: expected a list of strings"
    requirement = Requirement(key, str(operator), tuple(values))
    if field and len(values) != 1:
        return None, f"{operator} on a field takes exactly one value, got {len(values)}"
    if operator in ("In", "NotIn") and not values:
        return None, f"{operator} needs at least one value"
    if operator in ("Exists", "DoesNotExist") and values:
        return None, f"{operator} takes no values, got {len(values)}"
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            return None, f"{operator} takes exactly one value, got {len(values)}"
        if _parse_int64(values[0]) is None:
            return None, f"{operator} needs an integer, got {values[0][:32]!r}"
    return requirement, ""


def _parse_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``, or None where Go fails: ASCII digits with one optional sign,
    in int64's range. Python's ``int`` would also take spaces, underscores and other scripts' digits.

    >>> _parse_int64("+8"), _parse_int64(" 8"), _parse_int64("1_0"), _parse_int64("9223372036854775808")
    (8, None, None, None)
    """
    if len(text) > 21 or _INT64.fullmatch(text) is None:
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
