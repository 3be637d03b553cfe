"""The consolidator in the stack: off by default; on, its own function, schedule, role and Kubernetes group,
its holds in the snapshot bucket, read by the extender."""

from __future__ import annotations

import json
from typing import Any

from .conftest import Synthesise, by_prefix, joined

ON = {"consolidation": True, "consolidationScheduleMinutes": 5}


def _policy_of(synthesised: Any, role_prefix: str) -> list[dict[str, Any]]:
    """The statements of the policy attached to the role whose logical ID starts with ``role_prefix``."""
    policies = synthesised.resources("AWS::IAM::Policy")
    found = []
    for policy in policies.values():
        roles = [r.get("Ref", "") for r in policy["Properties"]["Roles"]]
        if any(r.startswith(role_prefix) for r in roles):
            found += policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def _actions_on(statements: list[dict[str, Any]], fragment: str) -> set[str]:
    actions: set[str] = set()
    for statement in statements:
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        if any(fragment in joined(r) for r in resources):
            wanted = statement["Action"]
            actions |= set(wanted if isinstance(wanted, list) else [wanted])
    return actions


def test_off_by_default_nothing_of_it_is_deployed(synth: Synthesise):
    synthesised = synth()
    assert synthesised.stack.consolidation is None
    functions = synthesised.resources("AWS::Lambda::Function")
    assert not [k for k in functions if k.startswith("Consolidation")]
    extender = by_prefix(functions, "ExtenderFunction")
    assert "HOLDS_URI" not in extender["Properties"]["Environment"]["Variables"]
    assert "consolidator" not in json.dumps(synthesised.stack.resolve(synthesised.stack.manifests))


def test_on_it_runs_on_its_rate_one_at_a_time_with_its_holds_where_the_extender_reads_them(synth: Synthesise):
    synthesised = synth(**ON)
    functions = synthesised.resources("AWS::Lambda::Function")
    function = by_prefix(functions, "ConsolidationFunction")["Properties"]
    assert function["Handler"] == "lambdas.consolidation.handler.lambda_handler"
    assert function["ReservedConcurrentExecutions"] == 1
    holds = joined(function["Environment"]["Variables"]["HOLDS_URI"])
    assert holds.endswith("/consolidation/holds.json") and holds.startswith("s3://")
    extender = by_prefix(functions, "ExtenderFunction")["Properties"]["Environment"]["Variables"]
    assert joined(extender["HOLDS_URI"]) == holds
    rules = [r["Properties"] for r in synthesised.resources("AWS::Events::Rule").values()]
    assert "rate(5 minutes)" in {r["ScheduleExpression"] for r in rules}


def test_its_role_reads_and_writes_the_holds_only_and_the_extender_only_reads_them(synth: Synthesise):
    synthesised = synth(**ON)
    mine = _policy_of(synthesised, "ConsolidationRole")
    assert _actions_on(mine, "/consolidation/holds.json") == {"s3:GetObject", "s3:PutObject"}
    assert _actions_on(mine, "/snapshot/") == set()
    assert not [s for s in mine if "dynamodb" in json.dumps(s["Action"]) or "ssm" in json.dumps(s["Action"])]
    extender = _policy_of(synthesised, "ExtenderRole")
    assert _actions_on(extender, "/consolidation/holds.json") == {"s3:GetObject"}


def test_its_kubernetes_group_may_list_and_evict_and_its_evictions_are_held_to_their_shape(synth: Synthesise):
    synthesised = synth(**ON)
    manifests = synthesised.stack.resolve(synthesised.stack.manifests)
    roles = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "ClusterRole"}
    rules = roles["gpu-scheduler-consolidator"]["rules"]
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in rules} == {
        ("", "nodes", ("list",)), ("", "pods", ("list",)), ("policy", "poddisruptionbudgets", ("list",)),
        ("", "pods/eviction", ("create",)),
    }  # fmt: skip
    policies = {d["metadata"]["name"] for d in manifests if d["kind"] == "ValidatingAdmissionPolicy"}
    assert "gpu-scheduler-consolidator-evictions" in policies
    entries = [e["Properties"] for e in synthesised.resources("AWS::EKS::AccessEntry").values()]
    assert any("gpu-scheduler:consolidator" in e.get("KubernetesGroups", []) for e in entries), entries


def test_on_it_has_its_alarm_and_dashboard_row_and_a_dry_run_deploys_without_evicting(synth: Synthesise):
    synthesised = synth(**ON)
    alarms = {
        a["Properties"].get("AlarmDescription", "") for a in synthesised.resources("AWS::CloudWatch::Alarm").values()
    }
    assert any(d.startswith("gpu-scheduler-consolidator: 3 or more failed runs") for d in alarms), alarms
    body = json.dumps(synthesised.resources("AWS::CloudWatch::Dashboard"))
    assert all(name in body for name in ("MovesPlanned", "EvictionsRefused", "HoldsLapsed"))
    variables = by_prefix(synthesised.resources("AWS::Lambda::Function"), "ConsolidationFunction")["Properties"][
        "Environment"]["Variables"]  # fmt: skip
    assert "DRY_RUN" not in variables
    dry = synth(**ON, consolidationDryRun=True)
    variables = by_prefix(dry.resources("AWS::Lambda::Function"), "ConsolidationFunction")["Properties"]["Environment"][
        "Variables"]  # fmt: skip
    assert variables["DRY_RUN"] == "true"
