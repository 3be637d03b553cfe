"""The private extender API, built on its own in a bare stack: with the endpoint it creates, and with an
imported one."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Template

from cdk.extender_api import ACCESS_LOG_FIELDS, STAGE, ExtenderApi

from .conftest import bare_stack, inline_function, joined

SCHEDULER_SG = "sg-0dddddddddddddddd"
IMPORTED_ENDPOINT = "vpce-0eeeeeeeeeeeeeeee"


def _template(**kwargs: Any) -> Template:
    stack = bare_stack()
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["unused"])
    handler = inline_function(stack)
    ExtenderApi(
        stack,
        "Api",
        vpc=vpc,
        subnet_ids=["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
        scheduler_security_group_id=SCHEDULER_SG,
        handler=handler,
        rate_limit=321,
        burst_limit=654,
        access_log_retention=logs.RetentionDays.ONE_MONTH,
        **kwargs,
    )
    return Template.from_stack(stack)


TEMPLATE = _template()
IMPORTED = _template(imported_endpoint_id=IMPORTED_ENDPOINT)


def template() -> Template:
    return TEMPLATE


def _endpoint_id() -> str:
    (endpoint_id,) = template().find_resources("AWS::EC2::VPCEndpoint")
    return str(endpoint_id)


def _api_id(t: Template) -> str:
    (api_id,) = t.find_resources("AWS::ApiGateway::RestApi")
    return str(api_id)


def _resource_policy(t: Template, endpoint: Any) -> list[dict[str, Any]]:
    """The statements expected: invoke allowed through ``endpoint``, and denied explicitly through any other."""
    return [
        {
            "Action": "execute-api:Invoke",
            "Condition": {operator: {"aws:SourceVpce": endpoint}},
            "Effect": effect,
            "Principal": {"AWS": "*"},
            "Resource": "execute-api:/*",
            "Sid": sid,
        }
        for sid, effect, operator in (
            ("AllowOnlyThroughTheClusterEndpoint", "Allow", "StringEquals"),
            ("DenyEverythingElse", "Deny", "StringNotEquals"),
        )
    ]


def test_the_api_is_private_and_associated_with_its_endpoint() -> None:
    (api,) = template().find_resources("AWS::ApiGateway::RestApi").values()
    # The association is what creates the <api>-<vpce> hostname kube-scheduler calls.
    assert api["Properties"]["EndpointConfiguration"] == {
        "Types": ["PRIVATE"],
        "VpcEndpointIds": [{"Ref": _endpoint_id()}],
    }


def test_the_resource_policy_allows_only_the_endpoint_and_denies_everything_else() -> None:
    (api,) = template().find_resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["Policy"]["Statement"] == _resource_policy(template(), {"Ref": _endpoint_id()})


def test_the_endpoint_is_an_execute_api_interface_without_private_dns_in_the_given_subnets() -> None:
    template().has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Interface",
            "PrivateDnsEnabled": False,
            "VpcId": "vpc-0123456789abcdef0",
            "SubnetIds": ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".execute-api"]]},
        },
    )


def test_private_dns_is_turned_on_only_when_asked() -> None:
    _template(private_dns=True).has_resource_properties("AWS::EC2::VPCEndpoint", {"PrivateDnsEnabled": True})


def test_the_endpoint_security_group_admits_443_from_the_scheduler_sg_only() -> None:
    (sg,) = template().find_resources("AWS::EC2::SecurityGroup").values()
    assert sg["Properties"]["SecurityGroupIngress"] == [
        {
            "Description": "the gpu-scheduler kube-scheduler pods",
            "FromPort": 443,
            "IpProtocol": "tcp",
            "SourceSecurityGroupId": SCHEDULER_SG,
            "ToPort": 443,
        }
    ]
    # No outbound rule but CDK's "disallow all" placeholder.
    (egress,) = sg["Properties"]["SecurityGroupEgress"]
    assert egress["CidrIp"] == "255.255.255.255/32"
    template().resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


def test_the_endpoint_policy_starts_at_this_account_and_is_narrowed_to_this_api_stage() -> None:
    (endpoint,) = template().find_resources("AWS::EC2::VPCEndpoint").values()
    (initial,) = endpoint["Properties"]["PolicyDocument"]["Statement"]
    assert (initial["Effect"], initial["Action"], initial["Principal"]) == ("Allow", "execute-api:Invoke", "*")
    assert joined(initial["Resource"]) == "arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:*"
    (call,) = template().find_resources("Custom::AWS").values()
    for phase in ("Create", "Update"):
        sdk_call = json.loads(joined(call["Properties"][phase]))
        assert (sdk_call["service"], sdk_call["action"]) == ("EC2", "ModifyVpcEndpoint")
        assert sdk_call["parameters"]["VpcEndpointId"] == f"<{_endpoint_id()}>"
        (statement,) = json.loads(sdk_call["parameters"]["PolicyDocument"])["Statement"]
        this_api = f"arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:<{_api_id(template())}>"
        assert statement == {
            "Sid": "InvokeOnlyTheExtenderApi",
            "Effect": "Allow",
            "Principal": "*",
            "Action": "execute-api:Invoke",
            "Resource": f"{this_api}/{STAGE}/*",
        }


def test_the_endpoint_policy_call_may_modify_only_this_endpoint() -> None:
    statements = [
        s
        for p in template().find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "ec2:ModifyVpcEndpoint" in json.dumps(s["Action"])
    ]
    (statement,) = statements
    assert statement["Action"] == "ec2:ModifyVpcEndpoint"
    assert joined(statement["Resource"]).endswith(f":vpc-endpoint/<{_endpoint_id()}>")


def test_the_url_is_the_endpoint_specific_hostname() -> None:
    stack = bare_stack()
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["unused"])
    api = ExtenderApi(
        stack,
        "Api",
        vpc=vpc,
        subnet_ids=["subnet-0aaaaaaaaaaaaaaaa"],
        scheduler_security_group_id=SCHEDULER_SG,
        handler=inline_function(stack),
        rate_limit=1,
        burst_limit=1,
        access_log_retention=logs.RetentionDays.ONE_MONTH,
    )
    built = Template.from_stack(stack)
    (endpoint_id,) = built.find_resources("AWS::EC2::VPCEndpoint")
    assert joined(stack.resolve(api.url)) == (
        f"https://<{_api_id(built)}>-<{endpoint_id}>.execute-api.<AWS::Region>.<AWS::URLSuffix>/{STAGE}"
    )


def test_an_imported_endpoint_is_named_by_policy_and_association_and_left_as_it_is() -> None:
    IMPORTED.resource_count_is("AWS::EC2::VPCEndpoint", 0)
    IMPORTED.resource_count_is("AWS::EC2::SecurityGroup", 0)
    IMPORTED.resource_count_is("Custom::AWS", 0)  # its policy is its owner's: it may serve other APIs
    (api,) = IMPORTED.find_resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["EndpointConfiguration"]["VpcEndpointIds"] == [IMPORTED_ENDPOINT]
    assert api["Properties"]["Policy"]["Statement"] == _resource_policy(IMPORTED, IMPORTED_ENDPOINT)


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
    for role in template().find_resources("AWS::IAM::Role").values():
        assert "apigateway" not in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])


def test_the_verbs_are_lambda_proxy_integrations() -> None:
    paths = {r["Properties"]["PathPart"] for r in template().find_resources("AWS::ApiGateway::Resource").values()}
    assert paths == {"filter", "prioritize", "healthz"}
    methods = template().find_resources("AWS::ApiGateway::Method").values()
    assert sorted(m["Properties"]["HttpMethod"] for m in methods) == ["GET", "POST", "POST"]
    for method in methods:
        assert method["Properties"]["Integration"]["Type"] == "AWS_PROXY"
        assert method["Properties"]["AuthorizationType"] == "NONE"
    template().has_resource_properties("AWS::Lambda::Permission", {"Action": "lambda:InvokeFunction"})
