"""The whole app, synthesised with cdk-nag: wiring, grants, functions and what the stack hands the cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from manifests.scheduler import LAMBDA_GROUP

from .conftest import IMPORTED_NETWORK, Synth

Synthesise = Callable[..., Synth]


def _by_prefix(resources: dict[str, Any], prefix: str) -> dict[str, Any]:
    (value,) = [v for k, v in resources.items() if k.startswith(prefix)]
    return dict(value)


def _granted(synthesised: Synth, role_prefix: str) -> set[tuple[str, str]]:
    """(action, resource) pairs of the role's policy, resources rendered as compact JSON."""
    role_ids = [k for k in synthesised.resources("AWS::IAM::Role") if k.startswith(role_prefix)]
    pairs = set()
    for policy in synthesised.resources("AWS::IAM::Policy").values():
        if not any(ref == {"Ref": r} for ref in policy["Properties"]["Roles"] for r in role_ids):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            pairs |= {(a, json.dumps(r, separators=(",", ":"))) for a in actions for r in resources}
    return pairs


def _actions(pairs: set[tuple[str, str]]) -> set[str]:
    return {action for action, _ in pairs}


def test_cdk_nag_passes_and_every_acknowledgment_has_a_reason(synth: Synthesise) -> None:
    for context in ({}, {"applyManifests": True, **IMPORTED_NETWORK}):
        report = synth(**context).nag_report()
        assert report["conclusion"] == "success" and report["violations"] == []
        assert report["suppressedViolations"], "the known findings are acknowledged, not absent"
        for suppressed in report["suppressedViolations"]:
            assert len(suppressed["reason"]) > 40, suppressed["ruleName"]


def test_each_role_holds_exactly_its_actions(synth: Synthesise) -> None:
    synthesised = synth()
    logs, xray = {"logs:CreateLogStream", "logs:PutLogEvents"}, {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert _actions(_granted(synthesised, "ExtenderRole")) == logs | xray | {"s3:GetObject", "s3:ListBucket"}
    assert _actions(_granted(synthesised, "NodeStateRole")) == logs | xray | {
        "s3:GetObject", "s3:PutObject", "s3:ListBucket", "eks:DescribeCluster", "aps:QueryMetrics",
        "ec2:DescribeInstanceTypes", "sqs:SendMessage",
    }  # fmt: skip
    assert _actions(_granted(synthesised, "DeletionCostRole")) == logs | xray | {
        "eks:DescribeCluster", "aps:QueryMetrics", "ssm:GetParameter", "sqs:SendMessage",
    }  # fmt: skip


def test_sharing_grants_the_ledger_exactly_and_serves_bind_and_preempt(synth: Synthesise) -> None:
    plain, sharing = synth(), synth(sharing=True)
    table = [k for k in sharing.resources("AWS::DynamoDB::Table")]
    ledger = json.dumps({"Fn::GetAtt": [table[0], "Arn"]}, separators=(",", ":"))
    extender = _granted(sharing, "ExtenderRole") - _granted(plain, "ExtenderRole")
    assert {(a, r) for a, r in extender if a.startswith("dynamodb:")} == {
        ("dynamodb:GetItem", ledger), ("dynamodb:PutItem", ledger), ("dynamodb:BatchGetItem", ledger)
    }  # fmt: skip
    assert _actions(extender) == {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:BatchGetItem",
                                  "eks:DescribeCluster"}  # fmt: skip
    node_state = _granted(sharing, "NodeStateRole") - _granted(plain, "NodeStateRole")
    assert node_state == {("dynamodb:Scan", ledger), ("dynamodb:PutItem", ledger)}
    functions = sharing.resources("AWS::Lambda::Function")
    env = _by_prefix(functions, "ExtenderFunction")["Properties"]["Environment"]["Variables"]
    assert env["LEDGER_TABLE"] == {"Ref": table[0]} and env["CLUSTER_NAME"] == "gpu-prod"
    assert env["SHARE_POLICY"] == "fgd_cpu"
    node_env = _by_prefix(functions, "NodeStateFunction")["Properties"]["Environment"]["Variables"]
    assert node_env["LEDGER_TABLE"] == {"Ref": table[0]}
    # bind loads the kubernetes client: the extender gets the refreshers' layer, still shared.
    assert len(_by_prefix(functions, "ExtenderFunction")["Properties"]["Layers"]) == 2
    sharing.template.resource_count_is("AWS::Lambda::LayerVersion", 2)
    paths = {r["Properties"]["PathPart"] for r in sharing.resources("AWS::ApiGateway::Resource").values()}
    assert paths == {"filter", "prioritize", "bind", "preempt", "healthz"}
    plain_paths = {r["Properties"]["PathPart"] for r in plain.resources("AWS::ApiGateway::Resource").values()}
    assert plain_paths == {"filter", "prioritize", "healthz"}
    assert sharing.nag_report()["violations"] == []


def test_only_actions_without_resource_level_permissions_are_granted_on_star(synth: Synthesise) -> None:
    synthesised = synth()
    for role in ("ExtenderRole", "NodeStateRole", "DeletionCostRole"):
        on_star = {action for action, resource in _granted(synthesised, role) if resource == '"*"'}
        allowed = {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "ec2:DescribeInstanceTypes"}
        assert on_star <= allowed, role


def test_snapshot_access_is_the_one_object_and_listing_only_its_key(synth: Synthesise) -> None:
    synthesised = synth()
    granted = _granted(synthesised, "NodeStateRole")
    object_resources = {r for a, r in granted if a in ("s3:GetObject", "s3:PutObject")}
    assert len(object_resources) == 1 and "/snapshot/cluster.snapshot" in object_resources.pop()
    policy = next(
        s
        for p in synthesised.resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s["Action"] == "s3:ListBucket"
    )
    assert policy["Condition"] == {"StringEquals": {"s3:prefix": ["snapshot/cluster.snapshot"]}}


def test_the_cluster_arn_and_parameter_are_exact(synth: Synthesise) -> None:
    granted = _granted(synth(), "DeletionCostRole")
    (cluster,) = [r for a, r in granted if a == "eks:DescribeCluster"]
    assert cluster.endswith(':cluster/gpu-prod"]]}')
    (parameter,) = [r for a, r in granted if a == "ssm:GetParameter"]
    assert "parameter/" in parameter


def test_functions_run_the_newest_python_on_the_chosen_architecture_with_tracing(synth: Synthesise) -> None:
    functions = synth().resources("AWS::Lambda::Function")
    assert len(functions) == 3
    for function in functions.values():
        props = function["Properties"]
        assert props["Runtime"] == "python3.14"
        assert props["Architectures"] == ["arm64"]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Handler"].startswith("lambdas.") and props["Handler"].endswith(".handler.lambda_handler")
        assert props["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == "GpuScheduler"
    extender = _by_prefix(functions, "ExtenderFunction")["Properties"]
    assert extender["ReservedConcurrentExecutions"] == 20
    assert extender["Environment"]["Variables"]["MAX_SNAPSHOT_AGE_S"] == "180"
    assert "SNAPSHOT_URI" in extender["Environment"]["Variables"] and "DeadLetterConfig" not in extender
    for name in ("NodeStateFunction", "DeletionCostFunction"):
        props = _by_prefix(functions, name)["Properties"]
        assert props["ReservedConcurrentExecutions"] == 1
        assert props["Environment"]["Variables"]["CLUSTER_NAME"] == "gpu-prod"
        assert "AMP_QUERY_URL" in props["Environment"]["Variables"]
        assert "DeadLetterConfig" in props  # invoked asynchronously by EventBridge


def test_extender_has_only_the_base_layer_and_refreshers_add_the_kube_layer(synth: Synthesise) -> None:
    functions = synth().resources("AWS::Lambda::Function")
    assert len(_by_prefix(functions, "ExtenderFunction")["Properties"]["Layers"]) == 1
    assert len(_by_prefix(functions, "NodeStateFunction")["Properties"]["Layers"]) == 2
    synth().template.resource_count_is("AWS::Lambda::LayerVersion", 2)  # shared, not one per function


def test_both_refreshers_run_every_minute_with_a_dlq_and_an_alarm_on_the_topic(synth: Synthesise) -> None:
    synthesised = synth()
    rules = synthesised.resources("AWS::Events::Rule").values()
    assert sorted(r["Properties"]["ScheduleExpression"] for r in rules) == ["rate(1 minute)", "rate(1 minute)"]
    assert all("DeadLetterConfig" in r["Properties"]["Targets"][0] for r in rules)
    (topic_id,) = synthesised.resources("AWS::SNS::Topic")
    alarms = [
        a
        for a in synthesised.resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
    ]
    assert len(alarms) == 2 and all(a["Properties"]["AlarmActions"] == [{"Ref": topic_id}] for a in alarms)


def test_schedule_rates_come_from_context(synth: Synthesise) -> None:
    rules = synth(nodeStateScheduleMinutes=2, deletionCostScheduleMinutes=5).resources("AWS::Events::Rule").values()
    assert sorted(r["Properties"]["ScheduleExpression"] for r in rules) == ["rate(2 minutes)", "rate(5 minutes)"]


def test_every_lambda_role_gets_an_access_entry_in_the_lambda_group(synth: Synthesise) -> None:
    synthesised = synth()
    entries = synthesised.resources("AWS::EKS::AccessEntry").values()
    grouped = {json.dumps(e["Properties"]["PrincipalArn"]): e["Properties"].get("KubernetesGroups") for e in entries}
    roles = [k for k in synthesised.resources("AWS::IAM::Role") if k.endswith(tuple("0123456789ABCDEF"))]
    for prefix in ("ExtenderRole", "NodeStateRole", "DeletionCostRole"):
        (role_id,) = [r for r in roles if r.startswith(prefix)]
        assert grouped[json.dumps({"Fn::GetAtt": [role_id, "Arn"]})] == [LAMBDA_GROUP]
    # The fourth is the AMP scraper's, mapped to a user rather than the Lambdas' group.
    assert len(entries) == 4


def test_an_imported_network_puts_the_endpoint_in_its_subnets_and_admits_its_cluster_sg(synth: Synthesise) -> None:
    synthesised = synth(**IMPORTED_NETWORK)
    synthesised.template.resource_count_is("AWS::EC2::VPC", 0)
    synthesised.template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcId": IMPORTED_NETWORK["vpcId"], "SubnetIds": IMPORTED_NETWORK["subnetIds"].split(",")},
    )
    synthesised.template.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "SecurityGroupIngress": [
                {
                    "Description": "kube-scheduler on cluster nodes",
                    "FromPort": 443,
                    "ToPort": 443,
                    "IpProtocol": "tcp",
                    "SourceSecurityGroupId": IMPORTED_NETWORK["clusterSecurityGroupId"],
                }
            ]
        },
    )


def test_the_demo_vpc_is_isolated_and_logs_rejected_flows(synth: Synthesise) -> None:
    synthesised = synth()
    synthesised.template.resource_count_is("AWS::EC2::NatGateway", 0)
    synthesised.template.resource_count_is("AWS::EC2::InternetGateway", 0)
    synthesised.template.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "REJECT"})


def test_provisioned_concurrency_fronts_the_api_with_a_live_alias(synth: Synthesise) -> None:
    synthesised = synth(extenderProvisionedConcurrency=4)
    synthesised.template.has_resource_properties(
        "AWS::Lambda::Alias", {"Name": "live", "ProvisionedConcurrencyConfig": {"ProvisionedConcurrentExecutions": 4}}
    )
    (alias_id,) = synthesised.resources("AWS::Lambda::Alias")
    uris = [
        json.dumps(m["Properties"]["Integration"]["Uri"])
        for m in synthesised.resources("AWS::ApiGateway::Method").values()
    ]
    assert uris and all(alias_id in uri for uri in uris)


def test_without_provisioned_concurrency_there_is_no_alias(synth: Synthesise) -> None:
    synth().template.resource_count_is("AWS::Lambda::Alias", 0)


def _applied_documents(synthesised: Synth) -> list[dict[str, Any]]:
    (manifest,) = synthesised.resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    body = manifest["Properties"]["Manifest"]
    assert isinstance(body, dict) and "Fn::Join" in body  # the API URL is resolved at deploy time
    text = "".join(p if isinstance(p, str) else "TOKEN" for p in body["Fn::Join"][1])
    docs: list[dict[str, Any]] = json.loads(text)
    return docs


def test_apply_manifests_applies_the_rbac_and_the_scheduler_with_the_api_url(synth: Synthesise) -> None:
    synthesised = synth(applyManifests=True, **IMPORTED_NETWORK)
    docs = _applied_documents(synthesised)
    kinds = [d["kind"] for d in docs]
    assert kinds[:2] == ["ClusterRole", "ClusterRoleBinding"] and "Deployment" in kinds
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (extender,) = yaml.safe_load(config_map["data"]["config.yaml"])["extenders"]
    assert extender["urlPrefix"] == "https://TOKEN.execute-api.TOKEN.TOKEN/v1"
    (manifest,) = synthesised.resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    (api_id,) = synthesised.resources("AWS::ApiGateway::RestApi")
    assert {"Ref": api_id} in manifest["Properties"]["Manifest"]["Fn::Join"][1]


def test_without_apply_manifests_nothing_touches_the_cluster_but_the_access_entries(synth: Synthesise) -> None:
    synth().template.resource_count_is("Custom::AWSCDK-EKS-KubernetesResource", 0)


@pytest.mark.parametrize("output", ["ExtenderUrl", "SchedulerConfigCommand", "SnapshotUri", "LedgerTable"])
def test_outputs_tell_the_operator_what_to_configure(synth: Synthesise, output: str) -> None:
    assert output in synth().template.find_outputs("*")
