"""The network the Lambdas run in: the cluster's VPC (or a demo VPC), their security group, and the VPC
endpoints through which they reach AWS without a NAT or a public cluster endpoint.

What each endpoint serves (the Lambdas' calls, ``adapters/``):

| service | type | used by |
|---|---|---|
| ``s3`` | gateway | the snapshot: node-state writes it, the extender reads it |
| ``dynamodb`` | gateway | the GPU ledger (only with sharing) |
| ``eks`` | interface | ``eks:DescribeCluster``: the cluster API's address and CA |
| ``ec2`` | interface | ``ec2:DescribeInstanceTypes``: GPU facts of nodes without GFD labels |
| ``ssm`` | interface | the deletion-cost workload config |
| ``aps-workspaces`` | interface | PromQL queries to Amazon Managed Prometheus |
| ``sts``, ``logs``, ``monitoring``, ``xray`` | interface | STS, CloudWatch Logs, CloudWatch, X-Ray for the SDKs |

The EKS token is a presigned ``sts:GetCallerIdentity`` URL made in the function (the API server calls STS,
not the Lambda), and Lambda itself delivers the functions' logs, EMF metrics and traces. A VPC that
already has one of these endpoints names it in ``existingVpcEndpoints``, and the stack creates the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Aws
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

GATEWAY_SERVICES = ("s3", "dynamodb")
INTERFACE_SERVICES = ("eks", "ec2", "ssm", "aps-workspaces", "sts", "logs", "monitoring", "xray")
SERVICES = GATEWAY_SERVICES + INTERFACE_SERVICES
HTTPS = ec2.Port.tcp(443)


@dataclass(frozen=True)
class FunctionNetwork:
    """Where a function runs: the VPC, its private subnets and its security group."""

    vpc: ec2.IVpc
    subnets: Sequence[ec2.ISubnet]
    security_group: ec2.ISecurityGroup


class SchedulerNetwork(Construct):
    """The VPC, the Lambdas' security group and the service endpoints.

    - ``vpc_id`` imports the cluster's VPC by ID (no lookup: the stack stays environment-agnostic), with
      its private ``subnet_ids`` and their ``route_table_ids``. Without it a demo VPC is made: isolated
      subnets in two zones, no NAT, rejected flows logged (kept ``log_retention``), and stand-ins for the
      cluster's and the scheduler pods' security groups.
    - The Lambdas' security group allows HTTPS out and nothing in. The cluster security group, which the
      cluster API's network interfaces carry, gets one rule admitting it on 443.
    - ``services`` get endpoints: gateways on the route tables, interface endpoints (private DNS on, so the
      SDKs' default hostnames resolve to them) in the subnets. Their security group admits 443 from the
      Lambdas and from the cluster security group: once private DNS points a service at the endpoint, the
      cluster's own pods and nodes reach it there too.

    Attributes: ``vpc``, ``subnet_ids``, ``cluster_security_group_id``, ``scheduler_security_group_id``,
    ``lambda_security_group``, ``functions`` (a :class:`FunctionNetwork`), ``endpoint_security_group``
    (None without interface endpoints), ``endpoints`` (``CfnVPCEndpoint`` by service).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        services: Sequence[str],
        vpc_id: str = "",
        subnet_ids: Sequence[str] = (),
        route_table_ids: Sequence[str] = (),
        cluster_security_group_id: str = "",
        scheduler_security_group_id: str = "",
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, construct_id)
        if vpc_id:
            # Only IDs are used: no lookup, no availability zones needed (DESIGN section 8).
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(self, "Vpc", vpc_id=vpc_id, availability_zones=["unused"])
            self.subnet_ids = list(subnet_ids)
            subnets = [ec2.Subnet.from_subnet_id(self, f"Subnet{i}", s) for i, s in enumerate(subnet_ids)]
            routes = list(route_table_ids)
            self.cluster_security_group_id = cluster_security_group_id
            self.scheduler_security_group_id = scheduler_security_group_id
        else:
            demo = ec2.Vpc(
                self,
                "DemoVpc",
                max_azs=2,
                nat_gateways=0,
                subnet_configuration=[
                    ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24)
                ],
                flow_logs={
                    "all": ec2.FlowLogOptions(
                        traffic_type=ec2.FlowLogTrafficType.REJECT,
                        destination=ec2.FlowLogDestination.to_cloud_watch_logs(
                            logs.LogGroup(self, "DemoFlowLogs", retention=log_retention)
                        ),
                    )
                },
            )
            self.vpc = demo
            subnets = list(demo.isolated_subnets)
            self.subnet_ids = [s.subnet_id for s in subnets]
            routes = [s.route_table.route_table_id for s in subnets]
            # Stand-ins for the EKS cluster security group and the scheduler pods' own.
            self.cluster_security_group_id = ec2.SecurityGroup(
                self, "DemoClusterSecurityGroup", vpc=demo, description="demo cluster"
            ).security_group_id
            self.scheduler_security_group_id = ec2.SecurityGroup(
                self, "DemoSchedulerSecurityGroup", vpc=demo, description="demo scheduler pods"
            ).security_group_id

        self.lambda_security_group = ec2.SecurityGroup(
            self,
            "LambdaSecurityGroup",
            vpc=self.vpc,
            description="gpu-scheduler Lambdas: HTTPS out, nothing in",
            allow_all_outbound=False,
        )
        self.lambda_security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), HTTPS, "the EKS API, the VPC endpoints and the S3/DynamoDB gateways"
        )
        ec2.CfnSecurityGroupIngress(
            self,
            "ClusterApiFromLambdas",
            group_id=self.cluster_security_group_id,
            source_security_group_id=self.lambda_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            description="gpu-scheduler Lambdas to the EKS API",
        )
        self.functions = FunctionNetwork(self.vpc, subnets, self.lambda_security_group)

        self.endpoints: dict[str, ec2.CfnVPCEndpoint] = {}
        for service in (s for s in services if s in GATEWAY_SERVICES):
            self.endpoints[service] = ec2.CfnVPCEndpoint(
                self,
                f"{_title(service)}Gateway",
                vpc_id=self.vpc.vpc_id,
                service_name=f"com.amazonaws.{Aws.REGION}.{service}",
                vpc_endpoint_type="Gateway",
                route_table_ids=routes,
            )
        interfaces = [s for s in services if s in INTERFACE_SERVICES]
        self.endpoint_security_group: ec2.SecurityGroup | None = None
        if not interfaces:
            return
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="gpu-scheduler AWS service endpoints: 443 from the Lambdas and the cluster",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(self.lambda_security_group, HTTPS, "gpu-scheduler Lambdas")
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.security_group_id(self.cluster_security_group_id), HTTPS, "the cluster's pods and nodes"
        )
        for service in interfaces:
            self.endpoints[service] = ec2.CfnVPCEndpoint(
                self,
                f"{_title(service)}Endpoint",
                vpc_id=self.vpc.vpc_id,
                service_name=f"com.amazonaws.{Aws.REGION}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=self.subnet_ids,
                security_group_ids=[self.endpoint_security_group.security_group_id],
            )


def _title(service: str) -> str:
    """``aps-workspaces`` -> ``ApsWorkspaces``: a construct ID."""
    return "".join(part.capitalize() for part in service.split("-"))
