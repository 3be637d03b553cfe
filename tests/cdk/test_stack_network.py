"""The whole app's network: the VPC endpoints and who their security groups admit, the Lambdas' subnets and
group, the endpoint URLs the functions are given, and the scheduler pods' security group in the manifests."""

from __future__ import annotations

from typing import Any

import pytest

from cdk.network import INTERFACE_SERVICES, VPC_WIDE_SERVICES

from .conftest import (
    APPLIED_WITH_SHARING,
    IMPORTED_ENDPOINT,
    IMPORTED_NETWORK,
    OURS,
    Synth,
    Synthesise,
    by_prefix,
    joined,
    our_functions,
)


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
    for function in our_functions(synthesised).values():
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
    for function in our_functions(synthesised).values():
        assert sorted(r["Ref"] for r in function["Properties"]["VpcConfig"]["SubnetIds"]) == subnets
    (scheduler_sg,) = [
        k for k in synthesised.resources("AWS::EC2::SecurityGroup") if k.startswith("NetworkSchedulerPodsSecurityGroup")
    ]
    (rule,) = _ingress(synthesised, "execute-api endpoint")
    assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [scheduler_sg, "GroupId"]}
    # Both gateways' route tables are the demo subnets' own.
    endpoints = _endpoint_services(synthesised)
    assert len(endpoints["s3"]["RouteTableIds"]) == 2


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
    functions = our_functions(synthesised)
    return {
        name: {
            key: _deployed(value, attributes)
            for key, value in by_prefix(functions, name)["Properties"]["Environment"]["Variables"].items()
        }
        for name in OURS
    }


def _endpoint_variables(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k.startswith("AWS_ENDPOINT_URL")}


def test_without_private_dns_each_function_gets_the_endpoints_of_exactly_the_services_it_calls(
    synth: Synthesise,
) -> None:
    sharing = _deployed_environments(synth(**APPLIED_WITH_SHARING))
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
    for environment in _deployed_environments(synth(**APPLIED_WITH_SHARING)).values():
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

    environments = _deployed_environments(synth(**APPLIED_WITH_SHARING))
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
