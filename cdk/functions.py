"""One Lambda function with its own role, log group and tracing, in the VPC: no managed policies, no
shared role."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from adapters.metric_catalogue import NAMESPACE
from cdk.lambda_code import RUNTIME, LambdaPackage
from cdk.network import FunctionNetwork

# What Lambda does with the execution role to attach a function to the VPC (the actions of the managed
# AWSLambdaVPCAccessExecutionRole, which this app does not attach). They have no useful resource scope.
VPC_ACCESS_ACTIONS = (
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
)


class Shared(TypedDict):
    """What every function in the stack shares."""

    package: LambdaPackage
    layer_scope: Construct
    log_retention_days: int
    network: FunctionNetwork


class SchedulerFunction(Construct):
    """A function from the package, in ``network``'s private subnets with its security group, with an
    execution role that holds only what is granted to it.

    Attributes: ``function``, ``role``, ``log_group``. With ``snap_start``, Lambda snapshots each published
    version once initialised (``lambdas/extender/handler.py`` registers what runs before and after).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        package: LambdaPackage,
        layer_scope: Construct,
        name: str,
        service: str,
        description: str,
        environment: Mapping[str, str],
        memory_mib: int,
        timeout: Duration,
        reserved_concurrency: int,
        log_retention_days: int,
        network: FunctionNetwork,
        dead_letter_queue: sqs.IQueue | None = None,
        layers: Sequence[lambda_.ILayerVersion] = (),
        snap_start: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(log_retention_days),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.role = self._role(name)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=package.architecture,
            code=package.code(name),
            handler=f"lambdas.{name}.handler.lambda_handler",
            layers=[*package.layers(layer_scope, name), *layers],
            description=description,
            # Every metric lands in one namespace with its service dimension (adapters/metric_catalogue.py).
            environment={"POWERTOOLS_SERVICE_NAME": service, "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE, **environment},
            memory_size=memory_mib,
            timeout=timeout,
            reserved_concurrent_executions=reserved_concurrency,
            role=self.role,
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE,
            dead_letter_queue=dead_letter_queue,
            vpc=network.vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=list(network.subnets)),
            security_groups=[network.security_group],
            # Initialised once per published version and restored from its snapshot (Python 3.12+).
            snap_start=lambda_.SnapStartConf.ON_PUBLISHED_VERSIONS if snap_start else None,
        )

    def _role(self, name: str) -> iam.Role:
        """The execution role, holding only what a function needs to run: writing its own log group and
        attaching to the VPC. The stack grants the rest."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"eks-gpu-scheduler {name}: only the grants made in the stack",
        )
        # Exactly the two calls the runtime makes, on this function's own log group.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
            )
        )
        role.add_to_policy(iam.PolicyStatement(actions=list(VPC_ACCESS_ACTIONS), resources=["*"]))
        return role


RETENTION_NAMES = {
    1: "ONE_DAY", 3: "THREE_DAYS", 5: "FIVE_DAYS", 7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH",
    60: "TWO_MONTHS", 90: "THREE_MONTHS", 120: "FOUR_MONTHS", 150: "FIVE_MONTHS", 180: "SIX_MONTHS",
    365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS", 1096: "THREE_YEARS",
    1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS", 2922: "EIGHT_YEARS",
}  # fmt: skip


def retention(days: int) -> logs.RetentionDays:
    """The CloudWatch Logs retention for ``days`` (one of the periods the service accepts)."""
    return getattr(logs.RetentionDays, RETENTION_NAMES[days])
