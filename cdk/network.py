"""The network the Lambdas run in: the cluster's VPC (or a demo VPC), their security group, and the VPC
endpoints through which they reach AWS without a NAT or a public cluster endpoint.

What each endpoint serves (the Lambdas' calls, ``adapters/``), and how a Lambda reaches it while the
endpoint's private DNS is off (the default, ``vpcEndpointPrivateDns``):

| service | type | used by | reached with private DNS off through |
|---|---|---|---|
| ``s3`` | gateway | the snapshot: node-state writes it, the extender reads it | the route tables |
| ``dynamodb`` | gateway | the GPU ledger (only with sharing) | the route tables |
| ``eks`` | interface | ``eks:DescribeCluster``: the cluster API's address and CA | ``AWS_ENDPOINT_URL_EKS`` |
| ``ec2`` | interface | ``ec2:DescribeInstanceTypes``: GPU facts of unlabelled nodes | ``AWS_ENDPOINT_URL_EC2`` |
| ``ssm`` | interface | the deletion-cost workload config (Powertools' SSM provider) | ``AWS_ENDPOINT_URL_SSM`` |
| ``aps-workspaces`` | interface | PromQL queries to Amazon Managed Prometheus | the host of ``AMP_QUERY_URL`` |
| ``sts``, ``logs``, ``monitoring``, ``xray`` | interface | nothing the Lambdas call: private DNS only | (none) |

boto3 and Powertools make their clients without an ``endpoint_url``, so botocore (1.31 and newer; the
Lambda runtime's, and 1.44 in ``requirements.lock``) takes each service's from ``AWS_ENDPOINT_URL_<ID>``.
The AMP client is plain HTTPS signed with SigV4, so its URL names the endpoint instead.

The EKS token is a presigned ``sts:GetCallerIdentity`` URL made in the function: the API server calls STS,
not the Lambda, and it accepts only STS's own hostnames in that URL. So there is deliberately no
``AWS_ENDPOINT_URL_STS``: it would put the endpoint's name into every token and the API server would
refuse them all. Lambda itself delivers the functions' logs and EMF metrics (stdout), and its X-Ray
daemon the traces. Those four endpoints therefore serve the Lambdas nothing, and are created only with
private DNS on (``VPC_WIDE_SERVICES``), where the cluster's own calls to those services reach them. A VPC
that already has one of these endpoints names it in ``existingVpcEndpoints``, and the stack creates the
rest (the Lambdas then use that endpoint's private DNS, or the VPC's own route to the service).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Aws, Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from manifests.scheduler import SECURE_PORT as SCHEDULER_PORT

GATEWAY_SERVICES = ("s3", "dynamodb")
INTERFACE_SERVICES = ("eks", "ec2", "ssm", "aps-workspaces", "sts", "logs", "monitoring", "xray")
SERVICES = GATEWAY_SERVICES + INTERFACE_SERVICES
VPC_WIDE_SERVICES = ("sts", "logs", "monitoring", "xray")
"""Services the Lambdas never call through the VPC (below): their endpoints are made only with private DNS on,
for the cluster's own calls that private DNS then sends to this stack's endpoints."""
HTTPS = ec2.Port.tcp(443)
SCHEDULER_PODS = ("securityGroupPolicy", "nodeSelector", "none")
"""How the scheduler pods reach the extender's endpoint: a ``SecurityGroupPolicy`` puts them in the admitted
group (created here unless given); ``nodeSelector`` runs them on a node group in the given group; ``none``: an
imported endpoint whose owner admits them."""
SDK_ENDPOINT_VARIABLES = {"eks": "AWS_ENDPOINT_URL_EKS", "ec2": "AWS_ENDPOINT_URL_EC2", "ssm": "AWS_ENDPOINT_URL_SSM"}
"""The botocore variable that points a service's clients at its endpoint, for the services the Lambdas call
through boto3 (never STS: see the module docstring)."""


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
    - ``services`` get endpoints: gateways on the route tables, interface endpoints in the subnets.
    - ``private_dns`` False (the default): the interface endpoints change nothing else in the VPC. The
      Lambdas are given each endpoint's own hostname (``endpoint_urls``, ``sdk_environment``), and the
      endpoints' security group admits 443 from the Lambdas only.
    - ``private_dns`` True: the services' default hostnames resolve to the endpoints for the whole VPC.
      The security group then also admits the cluster security group, so that the cluster's pods and
      nodes reach those services there too; any other source in the VPC (a pod with its own security
      group, another node group, an instance) is refused by it, and so loses those AWS APIs unless it
      is admitted (``endpoint_security_group``).

    Attributes: ``vpc``, ``subnet_ids``, ``cluster_security_group_id``, ``scheduler_security_group_id``,
    ``lambda_security_group``, ``functions`` (a :class:`FunctionNetwork`), ``endpoint_security_group``
    (None without interface endpoints), ``endpoints`` (``CfnVPCEndpoint`` by service), ``private_dns``,
    ``endpoint_urls`` (``https://`` and the endpoint's regional DNS name, by interface service; empty with
    ``private_dns``).
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
        scheduler_pods: str = "securityGroupPolicy",
        private_dns: bool = False,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, construct_id)
        if scheduler_pods not in SCHEDULER_PODS:
            raise ValueError(f"scheduler_pods: expected one of {', '.join(SCHEDULER_PODS)}, got {scheduler_pods!r}")
        self.private_dns = private_dns
        self.endpoint_urls: dict[str, str] = {}
        if vpc_id:
            # Only IDs are used: no lookup, no availability zones needed (DESIGN section 8).
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(self, "Vpc", vpc_id=vpc_id, availability_zones=["unused"])
            self.subnet_ids = list(subnet_ids)
            subnets = [ec2.Subnet.from_subnet_id(self, f"Subnet{i}", s) for i, s in enumerate(subnet_ids)]
            routes = list(route_table_ids)
            self.cluster_security_group_id = cluster_security_group_id
            self.scheduler_security_group_id = scheduler_security_group_id
        else:
            subnets, routes = self._demo_vpc(log_retention)
        self.scheduler_security_group: ec2.SecurityGroup | None = None
        if scheduler_pods == "securityGroupPolicy" and not self.scheduler_security_group_id:
            self.scheduler_security_group = self._scheduler_pods_group()
            self.scheduler_security_group_id = self.scheduler_security_group.security_group_id
        if scheduler_pods == "securityGroupPolicy":
            self._admit_scheduler_pods()

        self.lambda_security_group = self._lambda_group()
        self.functions = FunctionNetwork(self.vpc, subnets, self.lambda_security_group)
        self.endpoints: dict[str, ec2.CfnVPCEndpoint] = {}
        self._gateway_endpoints([s for s in services if s in GATEWAY_SERVICES], routes)
        self.endpoint_security_group: ec2.SecurityGroup | None = None
        interfaces = [s for s in services if s in INTERFACE_SERVICES]
        if interfaces:
            self._interface_endpoints(interfaces)

    def _demo_vpc(self, log_retention: logs.RetentionDays) -> tuple[list[ec2.ISubnet], list[str]]:
        """A demo VPC in place of the cluster's: isolated subnets in two zones, no NAT, rejected flows logged,
        and a stand-in for the cluster security group. Returns its subnets and their route tables."""
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
        # A stand-in for the EKS cluster security group.
        self.cluster_security_group_id = ec2.SecurityGroup(
            self, "DemoClusterSecurityGroup", vpc=demo, description="demo cluster"
        ).security_group_id
        self.scheduler_security_group_id = ""
        return subnets, [s.route_table.route_table_id for s in subnets]

    def _closed_group(self, construct_id: str, description: str) -> ec2.SecurityGroup:
        """A security group in the VPC that lets nothing out until a rule says so (CDK's default allows all)."""
        return ec2.SecurityGroup(self, construct_id, vpc=self.vpc, description=description, allow_all_outbound=False)

    def _lambda_group(self) -> ec2.SecurityGroup:
        """The Lambdas' security group: HTTPS out, nothing in; the cluster security group admits it on 443."""
        group = self._closed_group("LambdaSecurityGroup", "gpu-scheduler Lambdas: HTTPS out, nothing in")
        group.add_egress_rule(ec2.Peer.any_ipv4(), HTTPS, "the EKS API, the VPC endpoints and the S3/DynamoDB gateways")
        self._ingress(
            "ClusterApiFromLambdas",
            self.cluster_security_group_id,
            group.security_group_id,
            "tcp",
            443,
            "gpu-scheduler Lambdas to the EKS API",
        )
        return group

    def _gateway_endpoints(self, gateways: Sequence[str], route_table_ids: Sequence[str]) -> None:
        """A gateway endpoint per service, on the private subnets' route tables."""
        for service in gateways:
            self.endpoints[service] = ec2.CfnVPCEndpoint(
                self,
                f"{_title(service)}Gateway",
                vpc_id=self.vpc.vpc_id,
                service_name=f"com.amazonaws.{Aws.REGION}.{service}",
                vpc_endpoint_type="Gateway",
                route_table_ids=list(route_table_ids),
            )

    def _interface_endpoints(self, interfaces: Sequence[str]) -> None:
        """An interface endpoint per service in the subnets, behind one security group; without private DNS
        each one's own URL goes into ``endpoint_urls``."""
        self.endpoint_security_group = group = self._closed_group(
            "EndpointSecurityGroup",
            # One description for both settings: changing it would replace the group.
            "gpu-scheduler AWS service endpoints: 443 from the Lambdas (and the cluster with private DNS)",
        )
        group.add_ingress_rule(self.lambda_security_group, HTTPS, "gpu-scheduler Lambdas")
        if self.private_dns:
            # Private DNS sends the cluster's own calls to these services here too: admit them.
            group.add_ingress_rule(
                ec2.Peer.security_group_id(self.cluster_security_group_id), HTTPS, "the cluster's pods and nodes"
            )
        for service in interfaces:
            endpoint = ec2.CfnVPCEndpoint(
                self,
                f"{_title(service)}Endpoint",
                vpc_id=self.vpc.vpc_id,
                service_name=f"com.amazonaws.{Aws.REGION}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=self.private_dns,
                subnet_ids=self.subnet_ids,
                security_group_ids=[group.security_group_id],
            )
            self.endpoints[service] = endpoint
            if not self.private_dns:
                self.endpoint_urls[service] = f"https://{regional_dns_name(endpoint)}"

    def _scheduler_pods_group(self) -> ec2.SecurityGroup:
        """The scheduler pods' own security group, the one source the extender's endpoint admits: HTTPS out
        (the cluster API, that endpoint) and DNS to the cluster security group (CoreDNS)."""
        group = self._closed_group(
            "SchedulerPodsSecurityGroup",
            "gpu-scheduler kube-scheduler pods (SecurityGroupPolicy): the extender API admits them",
        )
        group.add_egress_rule(ec2.Peer.any_ipv4(), HTTPS, "the cluster API and the extender API's endpoint")
        cluster = ec2.Peer.security_group_id(self.cluster_security_group_id)
        group.add_egress_rule(cluster, ec2.Port.tcp(53), "CoreDNS")
        group.add_egress_rule(cluster, ec2.Port.udp(53), "CoreDNS")
        return group

    def _admit_scheduler_pods(self) -> None:
        """What a pod with a security group of its own needs from the cluster's (EKS, Security Groups for
        Pods): the API server and CoreDNS admit it, and it admits the kubelet's probes from the nodes."""
        cluster, pods = self.cluster_security_group_id, self.scheduler_security_group_id
        from_pods = "gpu-scheduler kube-scheduler pods to"
        probes = "the kubelet's probes of the gpu-scheduler kube-scheduler pods"
        rules = (
            ("SchedulerPodsToClusterApi", cluster, pods, "tcp", 443, f"{from_pods} the EKS API"),
            ("SchedulerPodsToCoreDnsTcp", cluster, pods, "tcp", 53, f"{from_pods} CoreDNS"),
            ("SchedulerPodsToCoreDnsUdp", cluster, pods, "udp", 53, f"{from_pods} CoreDNS"),
            ("KubeletProbesToSchedulerPods", pods, cluster, "tcp", SCHEDULER_PORT, probes),
        )
        for construct_id, group_id, source_id, protocol, port, description in rules:
            self._ingress(construct_id, group_id, source_id, protocol, port, description)

    def _ingress(self, construct_id: str, group_id: str, source_id: str, protocol: str, port: int, why: str) -> None:
        """``group_id`` admits ``source_id`` on ``port``: a rule of its own, as the group may be one this
        stack does not own (the cluster's)."""
        ec2.CfnSecurityGroupIngress(
            self,
            construct_id,
            group_id=group_id,
            source_security_group_id=source_id,
            ip_protocol=protocol,
            from_port=port,
            to_port=port,
            description=why,
        )

    def sdk_environment(self, *services: str) -> dict[str, str]:
        """``AWS_ENDPOINT_URL_<ID>`` for each of ``services`` this network made an endpoint for without
        private DNS: what a function's boto3 clients need to reach them (empty with private DNS, or for a
        service the VPC already has an endpoint for)."""
        unknown = [s for s in services if s not in SDK_ENDPOINT_VARIABLES]
        if unknown:
            expected = ", ".join(SDK_ENDPOINT_VARIABLES)
            raise ValueError(f"no SDK endpoint variable for {', '.join(unknown)}; expected some of {expected}")
        return {SDK_ENDPOINT_VARIABLES[s]: self.endpoint_urls[s] for s in services if s in self.endpoint_urls}


def regional_dns_name(endpoint: ec2.CfnVPCEndpoint) -> str:
    """The endpoint's own regional hostname, ``vpce-<id>-<suffix>.<service>.<region>.vpce.amazonaws.com``.

    ``DnsEntries`` lists ``<hosted zone>:<name>`` pairs which CloudFormation orders regional name first,
    then the zonal ones, then the private DNS names (when on): the first entry's name is the one to use.
    """
    return str(Fn.select(1, Fn.split(":", Fn.select(0, endpoint.attr_dns_entries))))


def _title(service: str) -> str:
    """``aps-workspaces`` -> ``ApsWorkspaces``: a construct ID."""
    return "".join(part.capitalize() for part in service.split("-"))
