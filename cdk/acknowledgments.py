"""The cdk-nag AwsSolutions findings the stack makes on purpose, each acknowledged with a reason that holds
for this stack (``docs/deploy.md`` lists them). Any other finding stops synth."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Validations
from constructs import Construct

if TYPE_CHECKING:
    from cdk.stack import GpuSchedulerStack

# The construct ID of aws-cdk-lib's singleton function behind every AwsCustomResource in a stack.
AWS_SDK_CALL_PROVIDER = "AWS679f53fac002430cb0da5b7982bd2287"


def acknowledge_findings(stack: GpuSchedulerStack) -> None:
    """The functions' wildcard grants, the snapshot bucket's missing access logs, the CDK-owned providers'
    findings where the stack has them, and the private API's."""
    star = (
        "X-Ray's PutTraceSegments and PutTelemetryRecords, and the network-interface actions Lambda takes "
        "with the execution role to attach the function to the VPC (those of the managed "
        "AWSLambdaVPCAccessExecutionRole), have no useful resource-level permissions"
    )
    for fn in (stack.extender, stack.deletion_cost, stack.consolidation):
        if fn is not None:
            _ack(fn.role, "IAM5[Resource::*]", star)
    _ack(
        stack.node_state.role,
        "IAM5[Resource::*]",
        star + "; ec2:DescribeInstanceTypes (GPU facts for unlabelled nodes) has none either",
    )
    _ack(
        stack.state.bucket,
        "S1",
        "the bucket holds the snapshot the node-state refresher rewrites every minute and logs "
        "writing (SnapshotBytes metric, its run report), and with consolidation the holds its run report "
        "logs; server access logs would add a second bucket and "
        "thousands of log objects a day. S3 data events are not in CloudTrail unless the account's trail "
        "records them: docs/security.md says how to add this bucket to it",
    )
    if stack.access.kubectl is not None:
        _acknowledge_kubectl_provider(stack, stack.access.kubectl)
    if stack.api.endpoint_policy is not None:
        _acknowledge_sdk_call_provider(stack)
    _acknowledge_api(stack)


def _acknowledge_api(stack: GpuSchedulerStack) -> None:
    """The private REST API: no WAF, authorizer or Cognito (kube-scheduler can sign nothing and send no
    header), so each reason names the network boundary: this stack's endpoint, or the imported one."""
    api = stack.api.api
    if stack.config.execute_api_endpoint_id:
        path = (
            f"the imported endpoint {stack.config.execute_api_endpoint_id}, whose security group and policy its "
            "owner keeps to the scheduler pods and this API (docs/security.md)"
        )
    else:
        path = (
            "this stack's execute-api endpoint, whose security group admits 443 only from the scheduler pods' "
            "security group and whose policy allows invoking only this API"
        )
    _ack(api, "APIG2", "the extender validates every request body itself and answers in the protocol's Error field")
    _ack(
        api,
        "APIG3",
        f"private API with no public path: its resource policy allows only aws:SourceVpce of {path}; "
        "stage throttling bounds the rate",
    )
    boundary = (
        "kube-scheduler can neither sign requests (SigV4) nor send headers, and a private REST API cannot "
        "verify client certificates, so no authorizer can check it; the boundary is the network: the "
        f"resource policy allows only {path}"
    )
    _ack(api, "APIG4", boundary)
    _ack(api, "COG4", "kube-scheduler cannot present Cognito tokens either: " + boundary)
    _ack(
        api,
        "APIG6",
        "execution logging needs the account-level API Gateway CloudWatch role, which this app must not "
        "create or change; JSON access logs and the Lambda's own logs cover each request",
    )


def _acknowledge_sdk_call_provider(stack: GpuSchedulerStack) -> None:
    """The CDK-owned function behind ``AwsCustomResource`` (the endpoint-policy call), deploy-time only."""
    provider = stack.node.try_find_child(AWS_SDK_CALL_PROVIDER)
    if provider is None:
        return
    _ack(
        provider,
        "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "the CDK-owned AwsCustomResource provider (one ec2:ModifyVpcEndpoint on this stack's endpoint at "
        "deploy time) attaches this managed policy to its own role",
    )


def _acknowledge_kubectl_provider(stack: GpuSchedulerStack, kubectl: Construct) -> None:
    """aws_eks_v2's kubectl provider: CDK-owned, deploy-time only. cdk-nag names some findings by the
    provider's own logical IDs, so those IDs are looked up rather than written out."""
    provider = "aws_eks_v2's kubectl provider (CDK-owned, runs only while deploying the manifests)"
    handler = kubectl.node.find_child("Handler")
    handler_id = stack.resolve(stack.get_logical_id(handler.node.default_child))
    ecr_public_id = stack.resolve(stack.get_logical_id(handler.node.find_child("HasEcrPublic")))
    # A managed policy attached only where ECR Public exists: cdk-nag names it by the whole condition.
    read_only = ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"
    ecr_public_arn = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, read_only]]}
    ecr_public = json.dumps({"Fn::If": [ecr_public_id, ecr_public_arn, {"Ref": "AWS::NoValue"}]}, separators=(",", ":"))
    managed = "arn:<AWS::Partition>:iam::aws:policy/"
    for policy in (
        f"{managed}service-role/AWSLambdaBasicExecutionRole",
        f"{managed}AmazonEC2ContainerRegistryReadOnly",
        ecr_public,
    ):
        _ack(kubectl, f"IAM4[Policy::{policy}]", f"{provider} attaches this managed policy to its own roles")
    _ack(
        kubectl,
        f"IAM5[Resource::<{handler_id}.Arn>:*]",
        f"{provider}: its framework invokes the handler's versions",
    )
    _ack(kubectl, "L1", f"{provider} pins its handler's runtime")


def _ack(scope: Construct, rule: str, reason: str) -> None:
    """Acknowledge cdk-nag's AwsSolutions ``rule`` on ``scope`` and below, for ``reason``."""
    Validations.of(scope).acknowledge(Acknowledgment(id=f"AwsSolutions::AwsSolutions-{rule}", reason=reason))
