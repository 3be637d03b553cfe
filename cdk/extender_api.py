"""The extender's private REST API: reachable only through one interface endpoint in the cluster's VPC,
from the scheduler pods only.

kube-scheduler cannot sign requests or send headers, so the network path is the boundary (DESIGN
section 6, docs/security.md):

- an interface VPC endpoint for ``execute-api`` whose security group admits TCP 443 only from the scheduler
  pods' security group, with private DNS off by default (on, it would take over
  ``*.execute-api.<region>.amazonaws.com`` for the whole VPC);
- an endpoint policy that allows ``execute-api:Invoke`` on this API's stage and nothing else. The API's
  association with the endpoint and its resource policy name the endpoint, so the endpoint cannot name the
  API in the same template: it is created allowing this account's APIs only, and a custom resource narrows
  it to this API once the API exists;
- a PRIVATE REST API associated with the endpoint (which creates the endpoint-specific hostname
  ``<api>-<vpce>.execute-api.<region>.amazonaws.com``, the ``urlPrefix`` kube-scheduler calls) and whose
  resource policy allows ``execute-api:Invoke`` only with ``aws:SourceVpce`` equal to that endpoint, and
  denies everything else explicitly.

An existing endpoint can be imported by ID instead; its security group and policy then stay its owner's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aws_cdk import Aws, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from scheduler_core.extender.facade import VERBS

STAGE = "v1"
# One JSON line per request: who (the VPC endpoint), what, how long (API Gateway's and the Lambda's own
# latency, in ms) and any error.
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "requestTime": "$context.requestTimeEpoch",
    "vpceId": "$context.identity.vpceId",
    "sourceIp": "$context.identity.sourceIp",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "status": "$context.status",
    "responseLength": "$context.responseLength",
    "responseLatencyMs": "$context.responseLatency",
    "integrationLatencyMs": "$context.integrationLatency",
    "integrationStatus": "$context.integrationStatus",
    "error": "$context.error.message",
}


def endpoint_policy(resource: str) -> dict[str, Any]:
    """The ``execute-api`` endpoint's policy: invoke ``resource`` (an execute-api ARN pattern), nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "InvokeOnlyTheExtenderApi",
                "Effect": "Allow",
                "Principal": "*",
                "Action": "execute-api:Invoke",
                "Resource": resource,
            }
        ],
    }


def resource_policy(endpoint_id: str) -> iam.PolicyDocument:
    """The API's resource policy: ``execute-api:Invoke`` allowed with ``aws:SourceVpce`` equal to
    ``endpoint_id``, and denied explicitly with any other."""
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid=sid,
                effect=effect,
                principals=[iam.AnyPrincipal()],
                actions=["execute-api:Invoke"],
                resources=["execute-api:/*"],
                conditions={operator: {"aws:SourceVpce": endpoint_id}},
            )
            for sid, effect, operator in (
                ("AllowOnlyThroughTheClusterEndpoint", iam.Effect.ALLOW, "StringEquals"),
                ("DenyEverythingElse", iam.Effect.DENY, "StringNotEquals"),
            )
        ]
    )


class ExtenderApi(Construct):
    """Attributes: ``endpoint`` (the created VPC endpoint, None when imported), ``endpoint_id``,
    ``endpoint_security_group`` (None when imported), ``endpoint_policy`` (the custom resource narrowing the
    created endpoint's policy to this API; None when imported), ``api``, ``url`` (the ``urlPrefix``
    kube-scheduler uses: ``https://<api>-<vpce>.execute-api.<region>.amazonaws.com/v1``), ``access_logs``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet_ids: Sequence[str],
        scheduler_security_group_id: str,
        handler: lambda_.IFunction,
        rate_limit: int,
        burst_limit: int,
        access_log_retention: logs.RetentionDays,
        verbs: Sequence[str] = VERBS,
        private_dns: bool = False,
        imported_endpoint_id: str = "",
    ) -> None:
        super().__init__(scope, construct_id)
        self.endpoint: ec2.CfnVPCEndpoint | None = None
        self.endpoint_security_group: ec2.SecurityGroup | None = None
        if imported_endpoint_id:
            self.endpoint_id = imported_endpoint_id
        else:
            self.endpoint = self._endpoint(vpc, subnet_ids, scheduler_security_group_id, private_dns)
            self.endpoint_id = self.endpoint.ref
        endpoint_id = self.endpoint_id
        # API Gateway writes access logs with the account's CloudWatch role, which this app never
        # creates or changes (cloud_watch_role=False; docs/deploy.md lists the one-time account setting).
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=access_log_retention)
        self.api = self._rest_api(endpoint_id, rate_limit, burst_limit)
        integration = apigw.LambdaIntegration(handler, proxy=True)
        # kube-scheduler POSTs to <urlPrefix>/<verb>; /healthz is for people and probes.
        for verb in verbs:
            self.api.root.add_resource(verb).add_method("POST", integration)
        self.api.root.add_resource("healthz").add_method("GET", integration)
        self.url = f"https://{self.api.rest_api_id}-{endpoint_id}.execute-api.{Aws.REGION}.{Aws.URL_SUFFIX}/{STAGE}"
        self.endpoint_policy: cr.AwsCustomResource | None = None
        if self.endpoint is not None:
            self.endpoint_policy = self._narrow_endpoint_policy(endpoint_id, access_log_retention)

    def _endpoint(
        self, vpc: ec2.IVpc, subnet_ids: Sequence[str], scheduler_security_group_id: str, private_dns: bool
    ) -> ec2.CfnVPCEndpoint:
        """The ``execute-api`` interface endpoint, admitting 443 from the scheduler pods' group only, and
        allowing this account's APIs until :meth:`_narrow_endpoint_policy` narrows it to this one."""
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=vpc,
            description="execute-api endpoint for the gpu-scheduler extender: 443 from the scheduler pods only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.security_group_id(scheduler_security_group_id),
            ec2.Port.tcp(443),
            "the gpu-scheduler kube-scheduler pods",
        )
        account_apis = f"arn:{Aws.PARTITION}:execute-api:{Aws.REGION}:{Aws.ACCOUNT_ID}:*"
        # L1, so the endpoint needs only subnet IDs (an imported VPC's AZs stay unknown; DESIGN section 8).
        return ec2.CfnVPCEndpoint(
            self,
            "ExecuteApiEndpoint",
            vpc_id=vpc.vpc_id,
            service_name=f"com.amazonaws.{Aws.REGION}.execute-api",
            vpc_endpoint_type="Interface",
            private_dns_enabled=private_dns,
            subnet_ids=list(subnet_ids),
            security_group_ids=[self.endpoint_security_group.security_group_id],
            # Until the custom resource below narrows it to this API: this account's APIs only.
            policy_document=endpoint_policy(account_apis),
        )

    def _rest_api(self, endpoint_id: str, rate_limit: int, burst_limit: int) -> apigw.RestApi:
        """The PRIVATE REST API, associated with the endpoint and invokable only through it; its stage
        throttled, traced and logging each request as JSON to ``access_logs``."""
        # Associating the endpoint is what makes the endpoint-specific hostname resolve (with private DNS
        # on or off).
        associated = ec2.InterfaceVpcEndpoint.from_interface_vpc_endpoint_attributes(
            self, "AssociatedEndpoint", port=443, vpc_endpoint_id=endpoint_id
        )
        return apigw.RestApi(
            self,
            "Api",
            description="gpu-scheduler kube-scheduler extender (private)",
            endpoint_configuration=apigw.EndpointConfiguration(
                types=[apigw.EndpointType.PRIVATE], vpc_endpoints=[associated]
            ),
            policy=resource_policy(endpoint_id),
            cloud_watch_role=False,
            deploy_options=apigw.StageOptions(
                stage_name=STAGE,
                throttling_rate_limit=rate_limit,
                throttling_burst_limit=burst_limit,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FIELDS)),
                metrics_enabled=True,
                tracing_enabled=True,
            ),
        )

    def _narrow_endpoint_policy(self, endpoint_id: str, log_retention: logs.RetentionDays) -> cr.AwsCustomResource:
        """``ec2:ModifyVpcEndpoint`` at deploy time: the endpoint's policy becomes this API's stage only."""
        this_api = f"arn:{Aws.PARTITION}:execute-api:{Aws.REGION}:{Aws.ACCOUNT_ID}:{self.api.rest_api_id}/{STAGE}/*"
        call = cr.AwsSdkCall(
            service="EC2",
            action="ModifyVpcEndpoint",
            parameters={
                "VpcEndpointId": endpoint_id,
                "PolicyDocument": Stack.of(self).to_json_string(endpoint_policy(this_api)),
            },
            physical_resource_id=cr.PhysicalResourceId.of(endpoint_id),
        )
        return cr.AwsCustomResource(
            self,
            "EndpointPolicy",
            on_update=call,  # also the create call
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [
                    iam.PolicyStatement(
                        actions=["ec2:ModifyVpcEndpoint"],
                        resources=[f"arn:{Aws.PARTITION}:ec2:{Aws.REGION}:{Aws.ACCOUNT_ID}:vpc-endpoint/{endpoint_id}"],
                    )
                ]
            ),
            install_latest_aws_sdk=False,
            log_group=logs.LogGroup(self, "EndpointPolicyLogs", retention=log_retention),
        )
