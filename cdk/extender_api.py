"""The extender's private REST API: reachable only through one interface endpoint in the cluster's VPC.

kube-scheduler cannot sign requests or send headers, so the network path is the boundary (DESIGN
section 6):

- an interface VPC endpoint for ``execute-api`` with private DNS, whose security group admits TCP 443
  only from the cluster security group;
- a PRIVATE REST API whose resource policy allows ``execute-api:Invoke`` only with ``aws:SourceVpce``
  equal to that endpoint, and denies everything else explicitly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from aws_cdk import Aws
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
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


class ExtenderApi(Construct):
    """Attributes: ``endpoint`` (the VPC endpoint), ``endpoint_security_group``, ``api``, ``url`` (the
    ``urlPrefix`` kube-scheduler uses: ``https://<api>.execute-api.<region>.amazonaws.com/v1``),
    ``access_logs``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet_ids: Sequence[str],
        cluster_security_group_id: str,
        handler: lambda_.IFunction,
        rate_limit: int,
        burst_limit: int,
        access_log_retention: logs.RetentionDays,
        verbs: Sequence[str] = VERBS,
    ) -> None:
        super().__init__(scope, construct_id)
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=vpc,
            description="execute-api endpoint for the gpu-scheduler extender: 443 from the EKS cluster only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.security_group_id(cluster_security_group_id),
            ec2.Port.tcp(443),
            "kube-scheduler on cluster nodes",
        )
        # L1, so the endpoint needs only subnet IDs (an imported VPC's AZs stay unknown; DESIGN section 8).
        self.endpoint = ec2.CfnVPCEndpoint(
            self,
            "ExecuteApiEndpoint",
            vpc_id=vpc.vpc_id,
            service_name=f"com.amazonaws.{Aws.REGION}.execute-api",
            vpc_endpoint_type="Interface",
            private_dns_enabled=True,
            subnet_ids=list(subnet_ids),
            security_group_ids=[self.endpoint_security_group.security_group_id],
        )
        endpoint_id = self.endpoint.ref
        invoke = "execute-api:/*"
        policy = iam.PolicyDocument(
            statements=[
                iam.PolicyStatement(
                    sid="AllowOnlyThroughTheClusterEndpoint",
                    principals=[iam.AnyPrincipal()],
                    actions=["execute-api:Invoke"],
                    resources=[invoke],
                    conditions={"StringEquals": {"aws:SourceVpce": endpoint_id}},
                ),
                iam.PolicyStatement(
                    sid="DenyEverythingElse",
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=["execute-api:Invoke"],
                    resources=[invoke],
                    conditions={"StringNotEquals": {"aws:SourceVpce": endpoint_id}},
                ),
            ]
        )
        # API Gateway writes access logs with the account's CloudWatch role, which this app never
        # creates or changes (cloud_watch_role=False; docs/deploy.md lists the one-time account setting).
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=access_log_retention)
        self.api = apigw.RestApi(
            self,
            "Api",
            description="gpu-scheduler kube-scheduler extender (private)",
            endpoint_configuration=apigw.EndpointConfiguration(types=[apigw.EndpointType.PRIVATE]),
            policy=policy,
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
        integration = apigw.LambdaIntegration(handler, proxy=True)
        # kube-scheduler POSTs to <urlPrefix>/<verb>; /healthz is for people and probes.
        for verb in verbs:
            self.api.root.add_resource(verb).add_method("POST", integration)
        self.api.root.add_resource("healthz").add_method("GET", integration)
        self.url = f"https://{self.api.rest_api_id}.execute-api.{Aws.REGION}.{Aws.URL_SUFFIX}/{STAGE}"
