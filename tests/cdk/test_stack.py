"""The whole app, synthesised with cdk-nag: its acknowledgments, the grants, the functions and their
schedules, the outputs, and the manifests the stack applies or hands the cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aws_cdk import Token

from cdk.functions import VPC_ACCESS_ACTIONS
from manifests.access import DELETION_COST, EXTENDER, NODE_STATE

from .conftest import (
    APPLIED_WITH_SHARING,
    IMPORTED_ENDPOINT,
    IMPORTED_NETWORK,
    Synth,
    Synthesise,
    by_prefix,
    joined,
    our_functions,
)

CONTEXTS: list[dict[str, Any]] = [{}, APPLIED_WITH_SHARING, IMPORTED_ENDPOINT]
CONTEXT_IDS = ["demo VPC", "imported VPC, sharing, manifests applied", "imported execute-api endpoint"]


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


@pytest.mark.parametrize("context", CONTEXTS, ids=CONTEXT_IDS)
def test_cdk_nag_passes_and_every_acknowledgment_has_a_reason(synth: Synthesise, context: dict[str, Any]) -> None:
    report = synth(**context).nag_report()
    assert report["conclusion"] == "success" and report["violations"] == []
    assert report["suppressedViolations"], "the known findings are acknowledged, not absent"
    for suppressed in report["suppressedViolations"]:
        assert len(suppressed["reason"]) > 40, suppressed["ruleName"]


def _reasons(synthesised: Synth) -> dict[str, str]:
    return {
        s["ruleName"].removeprefix("AwsSolutions-"): s["reason"]
        for s in synthesised.nag_report()["suppressedViolations"]
    }


def test_the_api_acknowledgments_name_the_boundary_this_stack_builds(synth: Synthesise) -> None:
    created, imported = _reasons(synth()), _reasons(synth(**IMPORTED_ENDPOINT))
    for rule in ("APIG3", "APIG4", "COG4"):
        assert "only from the scheduler pods' security group" in created[rule], rule
        assert "allows invoking only this API" in created[rule], rule
        assert "vpce-0eeeeeeeeeeeeeeee" in imported[rule] and "scheduler pods" in imported[rule], rule
    # The snapshot bucket's writes are not in CloudTrail by default: the reason must not say they are.
    assert "are not in CloudTrail unless" in created["S1"] and "is in CloudTrail" not in created["S1"]


def test_each_role_holds_exactly_its_actions(synth: Synthesise) -> None:
    synthesised = synth()
    logs, xray = {"logs:CreateLogStream", "logs:PutLogEvents"}, {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    vpc = set(VPC_ACCESS_ACTIONS)
    assert _actions(_granted(synthesised, "ExtenderRole")) == logs | xray | vpc | {"s3:GetObject", "s3:ListBucket"}
    assert _actions(_granted(synthesised, "NodeStateRole")) == logs | xray | vpc | {
        "s3:GetObject", "s3:PutObject", "s3:ListBucket", "eks:DescribeCluster", "aps:QueryMetrics",
        "ec2:DescribeInstanceTypes", "sqs:SendMessage",
    }  # fmt: skip
    assert _actions(_granted(synthesised, "DeletionCostRole")) == logs | xray | vpc | {
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
    assert node_state == {("dynamodb:Scan", ledger), ("dynamodb:GetItem", ledger), ("dynamodb:PutItem", ledger)}
    functions = sharing.resources("AWS::Lambda::Function")
    env = by_prefix(functions, "ExtenderFunction")["Properties"]["Environment"]["Variables"]
    assert env["LEDGER_TABLE"] == {"Ref": table[0]} and env["CLUSTER_NAME"] == "gpu-prod"
    assert env["SHARE_POLICY"] == "fgd_cpu"
    node_env = by_prefix(functions, "NodeStateFunction")["Properties"]["Environment"]["Variables"]
    assert node_env["LEDGER_TABLE"] == {"Ref": table[0]}
    # Both make and remove reservation pods, with the same image the generated admission policy admits.
    assert node_env["RESERVATION_IMAGE"] == env["RESERVATION_IMAGE"] == "public.ecr.aws/docker/library/python:3.12-slim"
    # bind loads the kubernetes client: the extender gets the refreshers' layer, still shared.
    assert len(by_prefix(functions, "ExtenderFunction")["Properties"]["Layers"]) == 2
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
        allowed = {
            "xray:PutTraceSegments",
            "xray:PutTelemetryRecords",
            "ec2:DescribeInstanceTypes",
            *VPC_ACCESS_ACTIONS,
        }
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
    functions = our_functions(synth())
    assert len(functions) == 3
    for function in functions.values():
        props = function["Properties"]
        assert props["Runtime"] == "python3.14"
        assert props["Architectures"] == ["arm64"]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Handler"].startswith("lambdas.") and props["Handler"].endswith(".handler.lambda_handler")
        assert props["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == "GpuScheduler"
    extender = by_prefix(functions, "ExtenderFunction")["Properties"]
    assert extender["ReservedConcurrentExecutions"] == 20
    assert extender["Environment"]["Variables"]["MAX_SNAPSHOT_AGE_S"] == "180"
    assert "SNAPSHOT_URI" in extender["Environment"]["Variables"] and "DeadLetterConfig" not in extender
    for name, reserved in (("NodeStateFunction", 2), ("DeletionCostFunction", 1)):
        props = by_prefix(functions, name)["Properties"]
        assert props["ReservedConcurrentExecutions"] == reserved, name
        assert props["Environment"]["Variables"]["CLUSTER_NAME"] == "gpu-prod"
        assert "AMP_QUERY_URL" in props["Environment"]["Variables"]
        assert "DeadLetterConfig" in props  # invoked asynchronously by EventBridge


def test_the_node_state_function_watches_past_the_next_run_or_polls_alone(synth: Synthesise) -> None:
    """Watching (the default), a run lasts 75 s of a 60 s rate: two may run at once, and the timeout
    leaves the margin. Polling, one at a time."""
    watching = by_prefix(our_functions(synth()), "NodeStateFunction")["Properties"]
    assert watching["Environment"]["Variables"]["WATCH_S"] == "75"
    assert (watching["Timeout"], watching["ReservedConcurrentExecutions"]) == (90, 2)
    longer = by_prefix(our_functions(synth(nodeStateWatchS=300)), "NodeStateFunction")["Properties"]
    assert (longer["Timeout"], longer["Environment"]["Variables"]["WATCH_S"]) == (315, "300")
    polling = by_prefix(our_functions(synth(nodeStateWatchS=0)), "NodeStateFunction")["Properties"]
    assert "WATCH_S" not in polling["Environment"]["Variables"]
    assert (polling["Timeout"], polling["ReservedConcurrentExecutions"]) == (90, 1)


def test_extender_has_only_the_base_layer_and_refreshers_add_the_kube_layer(synth: Synthesise) -> None:
    functions = our_functions(synth())
    assert len(by_prefix(functions, "ExtenderFunction")["Properties"]["Layers"]) == 1
    assert len(by_prefix(functions, "NodeStateFunction")["Properties"]["Layers"]) == 2
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


def _entries(synthesised: Synth) -> dict[str, list[str]]:
    """Kubernetes groups by the role-name prefix of each access entry's principal (Lambda roles only)."""
    found = {}
    for entry in synthesised.resources("AWS::EKS::AccessEntry").values():
        role = json.dumps(entry["Properties"]["PrincipalArn"])
        for prefix in ("ExtenderRole", "NodeStateRole", "DeletionCostRole"):
            if f'"{prefix}' in role:
                found[prefix] = entry["Properties"].get("KubernetesGroups")
    return found


def test_each_lambda_role_gets_its_own_group_and_the_extender_one_only_with_sharing(synth: Synthesise) -> None:
    assert _entries(synth()) == {"NodeStateRole": [NODE_STATE.group], "DeletionCostRole": [DELETION_COST.group]}
    # The third is the AMP scraper's, mapped to a user.
    assert len(synth().resources("AWS::EKS::AccessEntry")) == 3
    assert _entries(synth(sharing=True)) == {
        "ExtenderRole": [EXTENDER.group],
        "NodeStateRole": [NODE_STATE.group],
        "DeletionCostRole": [DELETION_COST.group],
    }


@pytest.mark.parametrize("context", CONTEXTS, ids=CONTEXT_IDS)
def test_every_log_group_has_a_retention_and_every_function_logs_to_one(
    synth: Synthesise, context: dict[str, Any]
) -> None:
    synthesised = synth(**context)
    groups = synthesised.resources("AWS::Logs::LogGroup")
    assert groups and all("RetentionInDays" in g["Properties"] for g in groups.values())
    # A function without its own log group would write to one Lambda creates, kept for ever.
    for name, function in synthesised.resources("AWS::Lambda::Function").items():
        group = function["Properties"].get("LoggingConfig", {}).get("LogGroup")
        assert isinstance(group, dict) and group.get("Ref") in groups, name


def test_the_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use(synth: Synthesise) -> None:
    synthesised = synth()
    (topic,) = synthesised.resources("AWS::SNS::Topic").values()
    (key_id,) = synthesised.resources("AWS::KMS::Key")
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    key = synthesised.resources("AWS::KMS::Key")[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    cloudwatch = [s for s in key["KeyPolicy"]["Statement"] if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}]
    (statement,) = cloudwatch
    assert statement["Action"] == ["kms:Decrypt", "kms:GenerateDataKey*"]


def test_provisioned_concurrency_fronts_the_api_with_a_live_alias(synth: Synthesise) -> None:
    synthesised = synth(extenderProvisionedConcurrency=4)
    synthesised.template.has_resource_properties(
        "AWS::Lambda::Alias", {"Name": "live", "ProvisionedConcurrencyConfig": {"ProvisionedConcurrentExecutions": 4}}
    )
    (alias_id,) = synthesised.resources("AWS::Lambda::Alias")
    uris = _api_uris(synthesised)
    assert uris and all(alias_id in uri for uri in uris)


def _api_uris(synthesised: Synth) -> list[str]:
    return [
        json.dumps(m["Properties"]["Integration"]["Uri"])
        for m in synthesised.resources("AWS::ApiGateway::Method").values()
    ]


def test_snapstart_is_on_for_the_extenders_published_version_and_the_api_calls_it_through_the_alias(
    synth: Synthesise,
) -> None:
    synthesised = synth()
    snapped = [fid for fid, f in our_functions(synthesised).items() if "SnapStart" in f["Properties"]]
    (extender,) = [fid for fid in our_functions(synthesised) if fid.startswith("Extender")]
    assert snapped == [extender]
    assert our_functions(synthesised)[extender]["Properties"]["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    ((version_id, version),) = synthesised.resources("AWS::Lambda::Version").items()
    assert version["Properties"]["FunctionName"] == {"Ref": extender}
    ((alias_id, alias),) = synthesised.resources("AWS::Lambda::Alias").items()
    assert alias["Properties"]["Name"] == "live" and "ProvisionedConcurrencyConfig" not in alias["Properties"]
    assert alias["Properties"]["FunctionVersion"] == {"Fn::GetAtt": [version_id, "Version"]}
    uris = _api_uris(synthesised)
    assert uris and all(alias_id in uri for uri in uris)


def test_snapstart_turned_off_leaves_the_api_on_the_function_itself(synth: Synthesise) -> None:
    synthesised = synth(extenderSnapStart=False)
    synthesised.template.resource_count_is("AWS::Lambda::Alias", 0)
    assert not any("SnapStart" in f["Properties"] for f in our_functions(synthesised).values())


def test_provisioned_concurrency_turns_snapstart_off(synth: Synthesise) -> None:
    synthesised = synth(extenderProvisionedConcurrency=2)
    assert not any("SnapStart" in f["Properties"] for f in our_functions(synthesised).values())


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
    # The endpoint-specific hostname: <api>-<vpce>.
    assert extender["urlPrefix"] == "https://TOKEN-TOKEN.execute-api.TOKEN.TOKEN/v1"
    (manifest,) = synthesised.resources("Custom::AWSCDK-EKS-KubernetesResource").values()
    (api_id,) = synthesised.resources("AWS::ApiGateway::RestApi")
    (endpoint_id,) = [k for k in synthesised.resources("AWS::EC2::VPCEndpoint") if k.startswith("ExtenderApi")]
    parts = manifest["Properties"]["Manifest"]["Fn::Join"][1]
    assert {"Ref": api_id} in parts and {"Ref": endpoint_id} in parts
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert "gpu-scheduler-assigned-gpus" in names
    assert "ValidatingAdmissionPolicy" not in [
        d["kind"] for d in _applied_documents(synth(applyManifests=True, admissionPolicy=False, **IMPORTED_NETWORK))
    ]


def test_without_apply_manifests_nothing_touches_the_cluster_but_the_access_entries(synth: Synthesise) -> None:
    synth().template.resource_count_is("Custom::AWSCDK-EKS-KubernetesResource", 0)


@pytest.mark.parametrize(
    "output",
    [
        "ExtenderUrl",
        "SchedulerConfigCommand",
        "SnapshotUri",
        "LedgerTable",
        "ExecuteApiEndpointId",
        "LambdaSecurityGroupId",
    ],
)
def test_outputs_tell_the_operator_what_to_configure(synth: Synthesise, output: str) -> None:
    assert output in synth().template.find_outputs("*")


def test_the_url_outputs_use_the_endpoint_specific_hostname(synth: Synthesise) -> None:
    synthesised = synth()
    (api_id,) = synthesised.resources("AWS::ApiGateway::RestApi")
    (endpoint_id,) = [k for k in synthesised.resources("AWS::EC2::VPCEndpoint") if k.startswith("ExtenderApi")]
    host = f"https://<{api_id}>-<{endpoint_id}>.execute-api.<AWS::Region>.<AWS::URLSuffix>/v1"
    outputs = synthesised.template.find_outputs("*")
    assert joined(outputs["ExtenderUrl"]["Value"]) == host
    assert f"--url {host} " in joined(outputs["SchedulerConfigCommand"]["Value"])


# ---- the kubectl provider's cluster-admin entry -----------------------------------------------------
def test_the_cluster_admin_entry_exists_only_with_apply_manifests_and_its_role_is_an_output(
    synth: Synthesise,
) -> None:
    from aws_cdk.assertions import Match

    admin = {"Properties": {"AccessPolicies": Match.any_value()}}
    plain = synth(**IMPORTED_NETWORK).template
    assert plain.find_resources("AWS::EKS::AccessEntry", admin) == {}
    assert "KubectlRoleArn" not in plain.find_outputs("*")
    applied = synth(**APPLIED_WITH_SHARING).template
    (entry,) = applied.find_resources("AWS::EKS::AccessEntry", admin).values()
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert joined(policy["PolicyArn"]).endswith("cluster-access-policy/AmazonEKSClusterAdminPolicy")
    output = applied.find_outputs("KubectlRoleArn")["KubectlRoleArn"]
    # The principal that holds cluster-admin for as long as the stack applies the manifests, named.
    assert output["Value"] == entry["Properties"]["PrincipalArn"]
    assert "cluster-admin" in output["Description"] and "for as long as the stack" in output["Description"]


@pytest.mark.parametrize(
    "context",
    [
        {"sharing": True, "extenderGpuPodsOnly": True, "shareDevice": "env", "admissionPolicy": False},
        {"schedulerNodeSelector": "role=scheduler", **IMPORTED_NETWORK},
        IMPORTED_ENDPOINT,
    ],
    ids=["sharing, GPU pods only, env devices, no admission policies", "a node selector", "an imported endpoint"],
)
def test_the_scheduler_config_command_writes_what_the_stack_applies(synth: Synthesise, context: dict[str, Any]) -> None:
    """The ``SchedulerConfigCommand`` output, run with the deploy-time URL and group, writes the documents the
    stack makes from its options with them (and applies with ``applyManifests``)."""
    import shlex

    from gpu_scheduler.cli import main
    from manifests.scheduler import all_manifests

    synthesised = synth(**context)
    stack, config = synthesised.stack, synthesised.stack.config
    url, group = "https://abc-vpce-0123.execute-api.us-east-1.amazonaws.com/v1", "sg-0123456789abcdef0"
    command = stack._config_command().replace(stack.api.url, url)
    made = stack.network.scheduler_security_group_id
    if made:
        command = command.replace(made, group)
    argv = shlex.split(command.split(" && ")[0])[1:]
    out = synthesised.outdir / "command.yaml"
    assert argv[0] == "scheduler-config" and argv[-2:] == ["--out", "gpu-scheduler.yaml"]
    assert main([*argv[:-2], "--out", str(out)]) == 0
    expected = all_manifests(
        config.scheduler_options(url, group if made else ""), admission_policy=config.admission_policy
    )
    assert list(yaml.safe_load_all(out.read_text())) == expected
    assert [d["kind"] for d in expected] == [d["kind"] for d in stack.manifests]


def test_the_scheduler_pods_roll_when_their_configuration_changes_and_only_then(
    package_dir: Path, tmp_path: Path
) -> None:
    """The digest on the pod template is taken with the API's URL written as the reference it resolves to,
    not as its placeholder, whose number changes from one synth to the next: two synths of one context give
    one digest (every deploy rolled the scheduler before), another weight another; and the URL itself rides
    on the template, resolved at deploy, so a new API rolls the pods too."""
    from cdk.app import build_app
    from manifests.scheduler import CONFIG_HASH_ANNOTATION, EXTENDER_URL_ANNOTATION

    context = {"clusterName": "gpu-prod", "packageDir": str(package_dir), **APPLIED_WITH_SHARING}

    def template(**more: Any) -> tuple[dict[str, str], Any]:
        _, stack = build_app({**context, **more}, str(tmp_path / f"out{len(list(tmp_path.iterdir()))}"))
        (deployment,) = [doc for doc in stack.manifests if doc["kind"] == "Deployment"]
        return deployment["spec"]["template"]["metadata"]["annotations"], stack

    (first, stack), (second, _) = template(), template()
    assert first[CONFIG_HASH_ANNOTATION] == second[CONFIG_HASH_ANNOTATION]
    assert first[EXTENDER_URL_ANNOTATION] == stack.api.url and Token.is_unresolved(first[EXTENDER_URL_ANNOTATION])
    assert template(extenderWeight="7")[0][CONFIG_HASH_ANNOTATION] != first[CONFIG_HASH_ANNOTATION]
