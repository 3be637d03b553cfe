"""The whole app, synthesised with cdk-nag: wiring, grants, functions and what the stack hands the cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from cdk.functions import VPC_ACCESS_ACTIONS
from cdk.network import INTERFACE_SERVICES, VPC_WIDE_SERVICES
from manifests.access import DELETION_COST, EXTENDER, NODE_STATE

from .conftest import IMPORTED_NETWORK, Synth, joined

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


OURS = ("ExtenderFunction", "NodeStateFunction", "DeletionCostFunction")
IMPORTED_ENDPOINT = {**{k: v for k, v in IMPORTED_NETWORK.items() if k != "schedulerSecurityGroupId"},
                     "executeApiEndpointId": "vpce-0eeeeeeeeeeeeeeee"}  # fmt: skip
CONTEXTS: list[dict[str, Any]] = [{}, {"applyManifests": True, "sharing": True, **IMPORTED_NETWORK}, IMPORTED_ENDPOINT]
CONTEXT_IDS = ["demo VPC", "imported VPC, sharing, manifests applied", "imported execute-api endpoint"]


def _functions(synthesised: Synth) -> dict[str, Any]:
    """The three Lambdas of the package (not the CDK-owned providers)."""
    return {k: v for k, v in synthesised.resources("AWS::Lambda::Function").items() if k.startswith(OURS)}


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
    env = _by_prefix(functions, "ExtenderFunction")["Properties"]["Environment"]["Variables"]
    assert env["LEDGER_TABLE"] == {"Ref": table[0]} and env["CLUSTER_NAME"] == "gpu-prod"
    assert env["SHARE_POLICY"] == "fgd_cpu"
    node_env = _by_prefix(functions, "NodeStateFunction")["Properties"]["Environment"]["Variables"]
    assert node_env["LEDGER_TABLE"] == {"Ref": table[0]}
    # Both make and remove reservation pods, with the same image the generated admission policy admits.
    assert node_env["RESERVATION_IMAGE"] == env["RESERVATION_IMAGE"] == "public.ecr.aws/docker/library/python:3.12-slim"
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
    functions = _functions(synth())
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
    for name, reserved in (("NodeStateFunction", 2), ("DeletionCostFunction", 1)):
        props = _by_prefix(functions, name)["Properties"]
        assert props["ReservedConcurrentExecutions"] == reserved, name
        assert props["Environment"]["Variables"]["CLUSTER_NAME"] == "gpu-prod"
        assert "AMP_QUERY_URL" in props["Environment"]["Variables"]
        assert "DeadLetterConfig" in props  # invoked asynchronously by EventBridge


def test_the_node_state_function_watches_past_the_next_run_or_polls_alone(synth: Synthesise) -> None:
    """Watching (the default), a run lasts 75 s of a 60 s rate: two may run at once, and the timeout
    leaves the margin. Polling, one at a time."""
    watching = _by_prefix(_functions(synth()), "NodeStateFunction")["Properties"]
    assert watching["Environment"]["Variables"]["WATCH_S"] == "75"
    assert (watching["Timeout"], watching["ReservedConcurrentExecutions"]) == (90, 2)
    longer = _by_prefix(_functions(synth(nodeStateWatchS=300)), "NodeStateFunction")["Properties"]
    assert (longer["Timeout"], longer["Environment"]["Variables"]["WATCH_S"]) == (315, "300")
    polling = _by_prefix(_functions(synth(nodeStateWatchS=0)), "NodeStateFunction")["Properties"]
    assert "WATCH_S" not in polling["Environment"]["Variables"]
    assert (polling["Timeout"], polling["ReservedConcurrentExecutions"]) == (90, 1)


def test_extender_has_only_the_base_layer_and_refreshers_add_the_kube_layer(synth: Synthesise) -> None:
    functions = _functions(synth())
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


def _ingress(synthesised: Synth, description_start: str) -> list[dict[str, Any]]:
    return [
        rule
        for sg in synthesised.resources("AWS::EC2::SecurityGroup").values()
        if sg["Properties"]["GroupDescription"].startswith(description_start)
        for rule in sg["Properties"].get("SecurityGroupIngress", [])
    ]


def test_an_imported_network_admits_only_the_scheduler_sg_to_the_api_endpoint(synth: Synthesise) -> None:
    synthesised = synth(**IMPORTED_NETWORK)
    synthesised.template.resource_count_is("AWS::EC2::VPC", 0)
    synthesised.template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcId": IMPORTED_NETWORK["vpcId"],
            "SubnetIds": IMPORTED_NETWORK["subnetIds"].split(","),
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".execute-api"]]},
            "PrivateDnsEnabled": False,
        },
    )
    assert _ingress(synthesised, "execute-api endpoint") == [
        {
            "Description": "the gpu-scheduler kube-scheduler pods",
            "FromPort": 443,
            "ToPort": 443,
            "IpProtocol": "tcp",
            "SourceSecurityGroupId": IMPORTED_NETWORK["schedulerSecurityGroupId"],
        }
    ]
    assert "ExtenderApiEndpointPolicy" in "".join(synthesised.resources("Custom::AWS"))


def test_private_dns_on_the_api_endpoint_comes_from_context(synth: Synthesise) -> None:
    synthesised = synth(executeApiPrivateDns=True, **IMPORTED_NETWORK)
    synthesised.template.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".execute-api"]]},
            "PrivateDnsEnabled": True,
        },
    )


def test_an_imported_api_endpoint_is_associated_and_named_in_the_url(synth: Synthesise) -> None:
    synthesised = synth(**IMPORTED_ENDPOINT)
    services = [joined(e["Properties"]["ServiceName"]) for e in synthesised.resources("AWS::EC2::VPCEndpoint").values()]
    assert not any(s.endswith(".execute-api") for s in services)
    (api,) = synthesised.resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["EndpointConfiguration"]["VpcEndpointIds"] == ["vpce-0eeeeeeeeeeeeeeee"]
    url = joined(synthesised.template.find_outputs("ExtenderUrl")["ExtenderUrl"]["Value"])
    (api_id,) = synthesised.resources("AWS::ApiGateway::RestApi")
    assert url == f"https://<{api_id}>-vpce-0eeeeeeeeeeeeeeee.execute-api.<AWS::Region>.<AWS::URLSuffix>/v1"


def test_the_lambdas_run_in_the_private_subnets_with_their_own_security_group(synth: Synthesise) -> None:
    synthesised = synth(**IMPORTED_NETWORK)
    (sg_id,) = [
        k for k in synthesised.resources("AWS::EC2::SecurityGroup") if k.startswith("NetworkLambdaSecurityGroup")
    ]
    for function in _functions(synthesised).values():
        assert function["Properties"]["VpcConfig"] == {
            "SubnetIds": IMPORTED_NETWORK["subnetIds"].split(","),
            "SecurityGroupIds": [{"Fn::GetAtt": [sg_id, "GroupId"]}],
        }
    (lambda_sg,) = [v for k, v in synthesised.resources("AWS::EC2::SecurityGroup").items() if k == sg_id]
    assert "SecurityGroupIngress" not in lambda_sg["Properties"]
    (egress,) = lambda_sg["Properties"]["SecurityGroupEgress"]
    assert (egress["IpProtocol"], egress["FromPort"], egress["ToPort"]) == ("tcp", 443, 443)
    # The cluster API's interfaces carry the cluster security group: it admits the Lambdas on 443, from this stack.
    synthesised.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "GroupId": IMPORTED_NETWORK["clusterSecurityGroupId"],
            "SourceSecurityGroupId": {"Fn::GetAtt": [sg_id, "GroupId"]},
            "FromPort": 443,
            "ToPort": 443,
        },
    )


def _endpoint_services(synthesised: Synth) -> dict[str, dict[str, Any]]:
    found = {}
    for endpoint in synthesised.resources("AWS::EC2::VPCEndpoint").values():
        name = joined(endpoint["Properties"]["ServiceName"]).removeprefix("com.amazonaws.<AWS::Region>.")
        found[name] = endpoint["Properties"]
    return found


def test_the_vpc_gets_gateway_and_interface_endpoints_for_what_the_lambdas_call(synth: Synthesise) -> None:
    endpoints = _endpoint_services(synth(sharing=True, **IMPORTED_NETWORK))
    called = [s for s in INTERFACE_SERVICES if s not in VPC_WIDE_SERVICES]
    for gateway in ("s3", "dynamodb"):
        assert endpoints[gateway]["VpcEndpointType"] == "Gateway"
        assert endpoints[gateway]["RouteTableIds"] == IMPORTED_NETWORK["routeTableIds"].split(",")
    for service in called:
        assert endpoints[service]["VpcEndpointType"] == "Interface"
        # Off by default: the services' names keep resolving as before for everything else in the VPC.
        assert endpoints[service]["PrivateDnsEnabled"] is False
        assert endpoints[service]["SubnetIds"] == IMPORTED_NETWORK["subnetIds"].split(",")
    # No endpoint that nothing uses: with private DNS off the Lambdas never reach STS, Logs, CloudWatch or
    # X-Ray through the VPC (cdk/network.py).
    assert set(endpoints) == {"s3", "dynamodb", "eks", "ec2", "ssm", "aps-workspaces", "execute-api"}
    # Without sharing nothing reads the ledger: no DynamoDB gateway.
    assert "dynamodb" not in _endpoint_services(synth(**IMPORTED_NETWORK))


def test_endpoints_the_vpc_already_has_are_not_created(synth: Synthesise) -> None:
    endpoints = _endpoint_services(
        synth(existingVpcEndpoints="s3,sts,ssm", vpcEndpointPrivateDns=True, **IMPORTED_NETWORK)
    )
    assert not {"s3", "sts", "ssm"} & set(endpoints) and {"eks", "ec2", "xray"} <= set(endpoints)


def test_private_dns_on_the_service_endpoints_comes_from_context(synth: Synthesise) -> None:
    endpoints = _endpoint_services(synth(vpcEndpointPrivateDns=True, **IMPORTED_NETWORK))
    # With private DNS on the cluster's own calls to these services reach the stack's endpoints: all are made.
    assert {s: endpoints[s]["PrivateDnsEnabled"] for s in INTERFACE_SERVICES} == dict.fromkeys(INTERFACE_SERVICES, True)
    assert endpoints["execute-api"]["PrivateDnsEnabled"] is False  # executeApiPrivateDns is its own setting


@pytest.mark.parametrize(
    ("context", "cluster_admitted"),
    [({}, False), ({"vpcEndpointPrivateDns": True}, True)],
    ids=["private DNS off: the Lambdas only", "private DNS on: and the cluster"],
)
def test_the_service_endpoints_admit_the_lambdas_and_with_private_dns_the_cluster(
    synth: Synthesise, context: dict[str, Any], cluster_admitted: bool
) -> None:
    synthesised = synth(**context, **IMPORTED_NETWORK)
    inline = _ingress(synthesised, "gpu-scheduler AWS service endpoints")
    expected = [IMPORTED_NETWORK["clusterSecurityGroupId"]] if cluster_admitted else []
    assert [r["SourceSecurityGroupId"] for r in inline] == expected
    (lambda_sg,) = [
        k for k in synthesised.resources("AWS::EC2::SecurityGroup") if k.startswith("NetworkLambdaSecurityGroup")
    ]
    (endpoint_sg,) = [
        k for k in synthesised.resources("AWS::EC2::SecurityGroup") if k.startswith("NetworkEndpointSecurityGroup")
    ]
    synthesised.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "GroupId": {"Fn::GetAtt": [endpoint_sg, "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [lambda_sg, "GroupId"]},
            "FromPort": 443,
        },
    )


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


def test_the_demo_vpc_is_isolated_and_logs_rejected_flows(synth: Synthesise) -> None:
    synthesised = synth()
    synthesised.template.resource_count_is("AWS::EC2::NatGateway", 0)
    synthesised.template.resource_count_is("AWS::EC2::InternetGateway", 0)
    synthesised.template.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "REJECT"})


def test_in_the_demo_vpc_the_lambdas_use_its_subnets_and_only_the_scheduler_stand_in_reaches_the_api(
    synth: Synthesise,
) -> None:
    synthesised = synth()
    subnets = sorted(k for k in synthesised.resources("AWS::EC2::Subnet"))
    for function in _functions(synthesised).values():
        assert sorted(r["Ref"] for r in function["Properties"]["VpcConfig"]["SubnetIds"]) == subnets
    (scheduler_sg,) = [
        k for k in synthesised.resources("AWS::EC2::SecurityGroup") if k.startswith("NetworkSchedulerPodsSecurityGroup")
    ]
    (rule,) = _ingress(synthesised, "execute-api endpoint")
    assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [scheduler_sg, "GroupId"]}
    # Both gateways' route tables are the demo subnets' own.
    endpoints = _endpoint_services(synthesised)
    assert len(endpoints["s3"]["RouteTableIds"]) == 2


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
    snapped = [fid for fid, f in _functions(synthesised).items() if "SnapStart" in f["Properties"]]
    (extender,) = [fid for fid in _functions(synthesised) if fid.startswith("Extender")]
    assert snapped == [extender]
    assert _functions(synthesised)[extender]["Properties"]["SnapStart"] == {"ApplyOn": "PublishedVersions"}
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
    assert not any("SnapStart" in f["Properties"] for f in _functions(synthesised).values())


def test_provisioned_concurrency_turns_snapstart_off(synth: Synthesise) -> None:
    synthesised = synth(extenderProvisionedConcurrency=2)
    assert not any("SnapStart" in f["Properties"] for f in _functions(synthesised).values())


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


# ---- how the Lambdas reach the interface endpoints --------------------------------------------------
REGION = "us-east-1"
WORKSPACE = "ws-0123abcd"


def _vpce(service: str) -> str:
    """A stand-in for an interface endpoint's regional DNS name, as ``DnsEntries`` gives it."""
    return f"vpce-0123456789abcdef0-ab12cd34.{service}.{REGION}.vpce.amazonaws.com"


def _deployed(value: Any, attributes: dict[tuple[str, str], Any]) -> Any:
    """``value`` as CloudFormation would resolve it, with stand-ins for the pseudo parameters and for
    ``attributes`` (anything else becomes ``<LogicalId>`` or ``<LogicalId.Attribute>``)."""
    if isinstance(value, str | int):
        return value
    if isinstance(value, list):
        return [_deployed(v, attributes) for v in value]
    ((function, argument),) = value.items()
    if function == "Ref":
        return {"AWS::Region": REGION, "AWS::URLSuffix": "amazonaws.com", "AWS::Partition": "aws"}.get(
            argument, f"<{argument}>"
        )
    if function == "Fn::GetAtt":
        return attributes.get(tuple(argument), f"<{'.'.join(argument)}>")
    if function == "Fn::Join":
        separator, parts = argument
        return separator.join(str(_deployed(p, attributes)) for p in parts)
    if function == "Fn::Select":
        index, items = argument
        return _deployed(items, attributes)[int(index)]
    if function == "Fn::Split":
        separator, text = argument
        return str(_deployed(text, attributes)).split(separator)
    raise AssertionError(f"no stand-in for {function}")


def _deployed_environments(synthesised: Synth) -> dict[str, dict[str, str]]:
    """Each of the three functions' environment variables once deployed: every interface endpoint's
    ``DnsEntries`` is its regional name, then a zonal one (``<hosted zone>:<name>``), and a created
    workspace's ID is :data:`WORKSPACE`."""
    attributes: dict[tuple[str, str], Any] = {}
    for logical_id, endpoint in synthesised.resources("AWS::EC2::VPCEndpoint").items():
        service = joined(endpoint["Properties"]["ServiceName"]).rsplit(".", 1)[-1]
        attributes[(logical_id, "DnsEntries")] = [f"Z7HUB22UULQXV:{_vpce(service)}",
                                                  f"Z7HUB22UULQXV:{REGION}a-{_vpce(service)}"]  # fmt: skip
    for logical_id in synthesised.resources("AWS::APS::Workspace"):
        attributes[(logical_id, "WorkspaceId")] = WORKSPACE
    functions = _functions(synthesised)
    return {
        name: {
            key: _deployed(value, attributes)
            for key, value in _by_prefix(functions, name)["Properties"]["Environment"]["Variables"].items()
        }
        for name in OURS
    }


def _endpoint_variables(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k.startswith("AWS_ENDPOINT_URL")}


def test_without_private_dns_each_function_gets_the_endpoints_of_exactly_the_services_it_calls(
    synth: Synthesise,
) -> None:
    sharing = _deployed_environments(synth(**CONTEXTS[1]))
    assert _endpoint_variables(sharing["NodeStateFunction"]) == {
        "AWS_ENDPOINT_URL_EKS": f"https://{_vpce('eks')}", "AWS_ENDPOINT_URL_EC2": f"https://{_vpce('ec2')}"
    }  # fmt: skip
    assert _endpoint_variables(sharing["DeletionCostFunction"]) == {
        "AWS_ENDPOINT_URL_EKS": f"https://{_vpce('eks')}", "AWS_ENDPOINT_URL_SSM": f"https://{_vpce('ssm')}"
    }  # fmt: skip
    # The extender calls EKS only for a bind's Kubernetes client, which only sharing has.
    assert _endpoint_variables(sharing["ExtenderFunction"]) == {"AWS_ENDPOINT_URL_EKS": f"https://{_vpce('eks')}"}
    assert _endpoint_variables(_deployed_environments(synth(**IMPORTED_NETWORK))["ExtenderFunction"]) == {}
    for name in ("NodeStateFunction", "DeletionCostFunction"):
        assert sharing[name]["AMP_QUERY_URL"] == f"https://{_vpce('aps-workspaces')}/workspaces/{WORKSPACE}", name


def test_no_function_is_pointed_away_from_sts_whose_host_the_eks_token_must_keep(synth: Synthesise) -> None:
    for environment in _deployed_environments(synth(**CONTEXTS[1])).values():
        assert not {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS"} & set(environment)


def test_with_private_dns_or_an_existing_endpoint_the_functions_use_the_default_hostnames(
    synth: Synthesise,
) -> None:
    default_amp = f"https://aps-workspaces.{REGION}.amazonaws.com/workspaces/{WORKSPACE}"
    for name, environment in _deployed_environments(synth(vpcEndpointPrivateDns=True, **IMPORTED_NETWORK)).items():
        assert _endpoint_variables(environment) == {}, name
        assert environment.get("AMP_QUERY_URL", default_amp) == default_amp, name
    existing = _deployed_environments(synth(existingVpcEndpoints="eks,aps-workspaces", **IMPORTED_NETWORK))
    assert _endpoint_variables(existing["NodeStateFunction"]) == {"AWS_ENDPOINT_URL_EC2": f"https://{_vpce('ec2')}"}
    assert existing["NodeStateFunction"]["AMP_QUERY_URL"] == default_amp


def test_the_sdk_clients_the_functions_make_go_to_the_endpoints_and_the_eks_token_names_sts(
    synth: Synthesise, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """botocore (``requirements.lock``) honours the variables for the clients ``adapters/`` and Powertools
    make; STS keeps its own hostname, which the API server requires in the token's presigned URL."""
    import base64
    import os
    import urllib.parse

    import boto3
    from aws_lambda_powertools.utilities.parameters import SSMProvider

    from adapters.amp import PrometheusClient
    from adapters.kube import TOKEN_PREFIX, EksTokenSource

    environments = _deployed_environments(synth(**CONTEXTS[1]))
    for variable in [v for v in os.environ if v.startswith("AWS_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    # What the Lambda runtime sets, then the two refreshers' own variables.
    runtime = {"AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing"}  # fmt: skip
    for variable, value in (runtime | environments["NodeStateFunction"] | environments["DeletionCostFunction"]).items():
        monkeypatch.setenv(variable, value)
    session = boto3.session.Session(region_name=REGION)  # as the handlers make it
    assert session.client("eks").meta.endpoint_url == f"https://{_vpce('eks')}"
    assert session.client("ec2").meta.endpoint_url == f"https://{_vpce('ec2')}"
    assert SSMProvider().client.meta.endpoint_url == f"https://{_vpce('ssm')}"
    token = EksTokenSource(session.client("sts"), "gpu-prod").token().removeprefix(TOKEN_PREFIX)
    presigned = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    assert urllib.parse.urlsplit(presigned).hostname in (f"sts.{REGION}.amazonaws.com", "sts.amazonaws.com")
    amp = PrometheusClient(os.environ["AMP_QUERY_URL"])
    assert urllib.parse.urlsplit(amp.url).hostname == _vpce("aps-workspaces")


# ---- the kubectl provider's cluster-admin entry -----------------------------------------------------
def test_the_cluster_admin_entry_exists_only_with_apply_manifests_and_its_role_is_an_output(
    synth: Synthesise,
) -> None:
    from aws_cdk.assertions import Match

    admin = {"Properties": {"AccessPolicies": Match.any_value()}}
    plain = synth(**IMPORTED_NETWORK).template
    assert plain.find_resources("AWS::EKS::AccessEntry", admin) == {}
    assert "KubectlRoleArn" not in plain.find_outputs("*")
    applied = synth(**CONTEXTS[1]).template
    (entry,) = applied.find_resources("AWS::EKS::AccessEntry", admin).values()
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert joined(policy["PolicyArn"]).endswith("cluster-access-policy/AmazonEKSClusterAdminPolicy")
    output = applied.find_outputs("KubectlRoleArn")["KubectlRoleArn"]
    # The principal that holds cluster-admin for as long as the stack applies the manifests, named.
    assert output["Value"] == entry["Properties"]["PrincipalArn"]
    assert "cluster-admin" in output["Description"] and "for as long as the stack" in output["Description"]


def _scheduler_network(synthesised: Synth) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """The one source the extender's endpoint admits, the manifests' scheduler Deployment, and their
    SecurityGroupPolicies (as the stack resolves them: a group it makes is a GetAtt)."""
    (rule,) = _ingress(synthesised, "execute-api endpoint")
    docs = synthesised.stack.resolve(synthesised.stack.manifests)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-scheduler"]
    policies = [d for d in docs if d["kind"] == "SecurityGroupPolicy"]
    assert [d["kind"] for d in docs].index("Deployment") > max(
        (i for i, d in enumerate(docs) if d["kind"] == "SecurityGroupPolicy"), default=-1
    ), "a pod created before its SecurityGroupPolicy keeps the node's groups"
    return rule["SourceSecurityGroupId"], deployment, policies


def _selects(policy: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    same_namespace = policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    return same_namespace and all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize(
    "context",
    [{}, IMPORTED_NETWORK, {k: v for k, v in IMPORTED_NETWORK.items() if k != "schedulerSecurityGroupId"}],
    ids=["demo VPC", "the group given", "a group the stack makes"],
)
def test_the_manifests_put_the_scheduler_pods_in_the_security_group_the_endpoint_admits(
    synth: Synthesise, context: dict[str, Any]
) -> None:
    synthesised = synth(**context)
    admitted, deployment, policies = _scheduler_network(synthesised)
    (policy,) = policies
    assert policy["apiVersion"] == "vpcresources.k8s.aws/v1beta1"
    assert policy["spec"]["securityGroups"]["groupIds"] == [admitted]
    assert _selects(policy, deployment)
    # The pods carry their own group: the cluster API and CoreDNS (on nodes in the cluster group) admit it, and
    # it admits the kubelet's probes on kube-scheduler's port.
    cluster = IMPORTED_NETWORK["clusterSecurityGroupId"] if context else None
    rules = [r["Properties"] for r in synthesised.resources("AWS::EC2::SecurityGroupIngress").values()]
    into_cluster = {(r["IpProtocol"], r["FromPort"]) for r in rules if r["SourceSecurityGroupId"] == admitted}
    assert {("tcp", 443), ("tcp", 53), ("udp", 53)} <= into_cluster
    probes = [r for r in rules if r["GroupId"] == admitted]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in probes] == [("tcp", 10259, 10259)]
    if cluster:
        assert all(r["GroupId"] == cluster for r in rules if r["SourceSecurityGroupId"] == admitted)
    output = synthesised.template.find_outputs("SchedulerSecurityGroupId")["SchedulerSecurityGroupId"]["Value"]
    assert output == admitted
    command = joined(synthesised.template.find_outputs("SchedulerConfigCommand")["SchedulerConfigCommand"]["Value"])
    assert " --security-group " in command


def test_a_group_the_stack_makes_for_the_scheduler_pods_lets_out_only_https_and_dns(synth: Synthesise) -> None:
    synthesised = synth(**{k: v for k, v in IMPORTED_NETWORK.items() if k != "schedulerSecurityGroupId"})
    (group,) = [
        v["Properties"]
        for k, v in synthesised.resources("AWS::EC2::SecurityGroup").items()
        if k.startswith("NetworkSchedulerPodsSecurityGroup")
    ]
    egress = {(r["IpProtocol"], r["FromPort"], r.get("CidrIp") or r.get("DestinationSecurityGroupId"))
              for r in group["SecurityGroupEgress"]}  # fmt: skip
    cluster = IMPORTED_NETWORK["clusterSecurityGroupId"]
    assert egress == {("tcp", 443, "0.0.0.0/0"), ("tcp", 53, cluster), ("udp", 53, cluster)}


def test_with_a_node_selector_the_scheduler_pods_run_on_the_admitted_node_group(synth: Synthesise) -> None:
    synthesised = synth(schedulerNodeSelector="eks.amazonaws.com/nodegroup=schedulers", **IMPORTED_NETWORK)
    admitted, deployment, policies = _scheduler_network(synthesised)
    assert admitted == IMPORTED_NETWORK["schedulerSecurityGroupId"] and policies == []
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "schedulers"}
    assert spec["tolerations"] == [{"key": "eks.amazonaws.com/nodegroup", "operator": "Exists"}]
    # The node group's own rules are its owner's: the stack adds none for pods it does not give a group.
    rules = [r["Properties"] for r in synthesised.resources("AWS::EC2::SecurityGroupIngress").values()]
    assert not [r for r in rules if admitted in (r["GroupId"], r.get("SourceSecurityGroupId"))]
    command = joined(synthesised.template.find_outputs("SchedulerConfigCommand")["SchedulerConfigCommand"]["Value"])
    assert "--node-selector eks.amazonaws.com/nodegroup=schedulers" in command
    assert f"--security-group {admitted}" in command  # for the guard: no SecurityGroupPolicy may name it


def test_with_an_imported_endpoint_the_manifests_leave_the_scheduler_pods_network_to_its_owner(
    synth: Synthesise,
) -> None:
    synthesised = synth(**IMPORTED_ENDPOINT)
    docs = synthesised.stack.resolve(synthesised.stack.manifests)
    assert "SecurityGroupPolicy" not in [d["kind"] for d in docs]
    assert "SchedulerSecurityGroupId" not in synthesised.template.find_outputs("*")


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
