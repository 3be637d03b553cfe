"""The network, built on its own in a bare stack: the service endpoints' private DNS (off unless asked), who
their security group admits, and the endpoint URLs the Lambdas are given instead of private DNS."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from cdk.network import INTERFACE_SERVICES, SDK_ENDPOINT_VARIABLES, SchedulerNetwork

from .conftest import IMPORTED_NETWORK, bare_stack

CLUSTER_SG = IMPORTED_NETWORK["clusterSecurityGroupId"]


def _build(*, private_dns: bool = False, services: tuple[str, ...] = ("s3", *INTERFACE_SERVICES)) -> tuple[
    SchedulerNetwork, Template
]:  # fmt: skip
    stack = bare_stack()
    network = SchedulerNetwork(
        stack,
        "Network",
        services=services,
        vpc_id=IMPORTED_NETWORK["vpcId"],
        subnet_ids=IMPORTED_NETWORK["subnetIds"].split(","),
        route_table_ids=IMPORTED_NETWORK["routeTableIds"].split(","),
        cluster_security_group_id=CLUSTER_SG,
        scheduler_security_group_id=IMPORTED_NETWORK["schedulerSecurityGroupId"],
        private_dns=private_dns,
    )
    return network, Template.from_stack(stack)


(OFF, OFF_TEMPLATE), (ON, ON_TEMPLATE) = _build(), _build(private_dns=True)


def _service(name: str) -> dict[str, Any]:
    return {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, f".{name}"]]}


def _logical_id(template: Template, kind: str, props: dict[str, Any]) -> str:
    (found,) = template.find_resources(kind, {"Properties": props})
    return str(found)


@pytest.mark.parametrize("service", INTERFACE_SERVICES)
def test_interface_endpoints_have_private_dns_off_unless_asked(service: str) -> None:
    OFF_TEMPLATE.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"ServiceName": _service(service), "VpcEndpointType": "Interface", "PrivateDnsEnabled": False},
    )
    ON_TEMPLATE.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"ServiceName": _service(service), "VpcEndpointType": "Interface", "PrivateDnsEnabled": True},
    )


def _endpoint_group(template: Template) -> tuple[str, dict[str, Any]]:
    found = template.find_resources(
        "AWS::EC2::SecurityGroup",
        {"Properties": {"GroupDescription": Match.string_like_regexp("^gpu-scheduler AWS service endpoints")}},
    )
    ((group, resource),) = found.items()
    return group, resource["Properties"]


def _endpoint_group_ingress(template: Template) -> list[Any]:
    group, props = _endpoint_group(template)
    inline = props.get("SecurityGroupIngress", [])
    separate = [
        r["Properties"]
        for r in template.find_resources(
            "AWS::EC2::SecurityGroupIngress", {"Properties": {"GroupId": {"Fn::GetAtt": [group, "GroupId"]}}}
        ).values()
    ]
    return [*inline, *separate]


def test_without_private_dns_the_endpoints_admit_the_lambdas_only() -> None:
    lambda_sg = _logical_id(OFF_TEMPLATE, "AWS::EC2::SecurityGroup", {"GroupDescription": Match.string_like_regexp(
        "^gpu-scheduler Lambdas")})  # fmt: skip
    sources = [r.get("SourceSecurityGroupId") for r in _endpoint_group_ingress(OFF_TEMPLATE)]
    assert sources == [{"Fn::GetAtt": [lambda_sg, "GroupId"]}]


def test_with_private_dns_the_endpoints_also_admit_the_cluster_whose_calls_then_resolve_to_them() -> None:
    sources = [r.get("SourceSecurityGroupId") for r in _endpoint_group_ingress(ON_TEMPLATE)]
    assert CLUSTER_SG in sources and len(sources) == 2
    # Toggling the setting must not replace the group (GroupDescription is immutable): one description.
    assert _endpoint_group(ON_TEMPLATE)[1]["GroupDescription"] == _endpoint_group(OFF_TEMPLATE)[1]["GroupDescription"]


def _dns_name_of(template: Template, service: str) -> dict[str, Any]:
    """What ``https://`` + the endpoint's regional DNS name synthesises to."""
    endpoint = _logical_id(template, "AWS::EC2::VPCEndpoint", {"ServiceName": _service(service)})
    first = {"Fn::Select": [0, {"Fn::GetAtt": [endpoint, "DnsEntries"]}]}
    return {"Fn::Join": ["", ["https://", {"Fn::Select": [1, {"Fn::Split": [":", first]}]}]]}


def test_without_private_dns_each_interface_endpoint_has_a_url_on_its_own_dns_name() -> None:
    assert set(OFF.endpoint_urls) == set(INTERFACE_SERVICES)
    stack = OFF.vpc.stack
    for service, url in OFF.endpoint_urls.items():
        assert stack.resolve(url) == _dns_name_of(OFF_TEMPLATE, service), service


def test_the_sdk_environment_points_boto3_at_the_endpoints_and_is_empty_with_private_dns() -> None:
    stack = OFF.vpc.stack
    environment = stack.resolve(OFF.sdk_environment("eks", "ec2", "ssm"))
    assert environment == {
        variable: _dns_name_of(OFF_TEMPLATE, service) for service, variable in SDK_ENDPOINT_VARIABLES.items()
    }
    assert ON.endpoint_urls == {} and ON.sdk_environment("eks", "ec2", "ssm") == {}


def test_a_service_whose_endpoint_the_vpc_already_has_gets_no_url() -> None:
    network, _ = _build(services=("ec2", "ssm"))
    assert set(network.sdk_environment("eks", "ec2", "ssm")) == {"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_SSM"}


def test_no_sdk_variable_is_offered_for_sts_whose_host_the_eks_token_must_keep() -> None:
    with pytest.raises(ValueError, match="no SDK endpoint variable for sts; expected some of eks, ec2, ssm"):
        OFF.sdk_environment("eks", "sts")
