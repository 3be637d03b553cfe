"""The private extender API, built on its own in a bare stack."""

from __future__ import annotations

import json

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Template

from cdk.extender_api import ACCESS_LOG_FIELDS, STAGE, ExtenderApi

from .conftest import bare_stack, inline_function

CLUSTER_SG = "sg-0cccccccccccccccc"


def _template() -> Template:
    stack = bare_stack()
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["unused"])
    handler = inline_function(stack)
    ExtenderApi(
        stack,
        "Api",
        vpc=vpc,
        subnet_ids=["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
        cluster_security_group_id=CLUSTER_SG,
        handler=handler,
        rate_limit=321,
        burst_limit=654,
        access_log_retention=logs.RetentionDays.ONE_MONTH,
    )
    return Template.from_stack(stack)


TEMPLATE = _template()


def template() -> Template:
    return TEMPLATE


def _endpoint_ref() -> dict[str, str]:
    (endpoint_id,) = template().find_resources("AWS::EC2::VPCEndpoint")
    return {"Ref": endpoint_id}


def test_the_api_is_private() -> None:
    template().has_resource_properties("AWS::ApiGateway::RestApi", {"EndpointConfiguration": {"Types": ["PRIVATE"]}})


def test_the_resource_policy_allows_only_the_endpoint_and_denies_everything_else() -> None:
    (api,) = template().find_resources("AWS::ApiGateway::RestApi").values()
    statements = api["Properties"]["Policy"]["Statement"]
    assert statements == [
        {
            "Action": "execute-api:Invoke",
            "Condition": {"StringEquals": {"aws:SourceVpce": _endpoint_ref()}},
            "Effect": "Allow",
            "Principal": {"AWS": "*"},
            "Resource": "execute-api:/*",
            "Sid": "AllowOnlyThroughTheClusterEndpoint",
        },
        {
            "Action": "execute-api:Invoke",
            "Condition": {"StringNotEquals": {"aws:SourceVpce": _endpoint_ref()}},
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Resource": "execute-api:/*",
            "Sid": "DenyEverythingElse",
        },
    ]


def test_the_endpoint_is_an_execute_api_interface_with_private_dns_in_the_given_subnets() -> None:
    template().has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Interface",
            "PrivateDnsEnabled": True,
            "VpcId": "vpc-0123456789abcdef0",
            "SubnetIds": ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".execute-api"]]},
        },
    )


def test_the_endpoint_security_group_admits_443_from_the_cluster_sg_only() -> None:
    (sg,) = template().find_resources("AWS::EC2::SecurityGroup").values()
    assert sg["Properties"]["SecurityGroupIngress"] == [
        {
            "Description": "kube-scheduler on cluster nodes",
            "FromPort": 443,
            "IpProtocol": "tcp",
            "SourceSecurityGroupId": CLUSTER_SG,
            "ToPort": 443,
        }
    ]
    # No outbound rule but CDK's "disallow all" placeholder.
    (egress,) = sg["Properties"]["SecurityGroupEgress"]
    assert egress["CidrIp"] == "255.255.255.255/32"
    template().resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


def test_the_stage_throttles_traces_and_writes_json_access_logs() -> None:
    (stage,) = template().find_resources("AWS::ApiGateway::Stage").values()
    props = stage["Properties"]
    assert props["StageName"] == STAGE and props["TracingEnabled"] is True
    (settings,) = props["MethodSettings"]
    assert settings["ThrottlingRateLimit"] == 321 and settings["ThrottlingBurstLimit"] == 654
    assert json.loads(props["AccessLogSetting"]["Format"]) == ACCESS_LOG_FIELDS
    template().has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 30})


def test_no_cloudwatch_role_or_account_setting_is_created() -> None:
    template().resource_count_is("AWS::ApiGateway::Account", 0)
    template().resource_count_is("AWS::IAM::Role", 1)  # the test handler's own role only


def test_the_verbs_are_lambda_proxy_integrations() -> None:
    paths = {r["Properties"]["PathPart"] for r in template().find_resources("AWS::ApiGateway::Resource").values()}
    assert paths == {"filter", "prioritize", "healthz"}
    methods = template().find_resources("AWS::ApiGateway::Method").values()
    assert sorted(m["Properties"]["HttpMethod"] for m in methods) == ["GET", "POST", "POST"]
    for method in methods:
        assert method["Properties"]["Integration"]["Type"] == "AWS_PROXY"
        assert method["Properties"]["AuthorizationType"] == "NONE"
    template().has_resource_properties("AWS::Lambda::Permission", {"Action": "lambda:InvokeFunction"})
