from __future__ import annotations

import re

import pytest

from cdk.config import DeployConfig
from cdk.network import INTERFACE_SERVICES
from scheduler_core.errors import ConfigError

from .conftest import IMPORTED_NETWORK


def test_context_strings_from_the_command_line_are_parsed_by_field_type() -> None:
    config = DeployConfig.from_context(
        {
            "clusterName": "prod",
            **IMPORTED_NETWORK,
            "applyManifests": "true",
            "extenderWeight": "7",
            "deletionCostConfig": '{"workloads": [{"policy": "static", "static_cost": 5}]}',
        }
    )
    assert config.subnet_ids == ("subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb")
    assert config.apply_manifests is True and config.extender_weight == 7
    assert config.deletion_cost_config["workloads"][0]["policy"] == "static"
    assert not config.demo_vpc


def test_the_extender_sees_every_pod_of_the_profile_unless_told_gpu_pods_only() -> None:
    url = "https://x.example/prod"
    assert DeployConfig.from_context({"clusterName": "prod"}).scheduler_options(url).gpu_pods_only is False
    only = DeployConfig.from_context({"clusterName": "prod", "extenderGpuPodsOnly": "true"})
    assert only.scheduler_options(url).gpu_pods_only is True


def test_without_a_vpc_the_demo_network_is_used() -> None:
    assert DeployConfig.from_context({"clusterName": "prod"}).demo_vpc


def test_the_private_api_defaults_are_the_safe_ones() -> None:
    config = DeployConfig.from_context({"clusterName": "prod"})
    assert config.execute_api_private_dns is False and config.admission_policy is True
    assert config.vpc_endpoint_private_dns is False
    assert DeployConfig.from_context({"clusterName": "prod", "vpcEndpointPrivateDns": "true"}).vpc_endpoint_private_dns
    assert (config.dcgm_exporter_namespace, config.kube_state_metrics_namespace) == ("gpu-operator", "kube-system")


def test_the_stack_creates_the_endpoints_the_vpc_lacks_and_dynamodb_only_with_sharing() -> None:
    plain = DeployConfig.from_context({"clusterName": "prod"})
    assert "dynamodb" not in plain.vpc_endpoints and {"s3", "eks", "ec2", "ssm", "aps-workspaces"} <= set(
        plain.vpc_endpoints
    )
    sharing = DeployConfig.from_context({"clusterName": "prod", "sharing": "true", "existingVpcEndpoints": "s3,sts"})
    assert "dynamodb" in sharing.vpc_endpoints and not {"s3", "sts"} & set(sharing.vpc_endpoints)


def test_an_imported_vpc_whose_gateways_exist_needs_no_route_tables() -> None:
    network = {k: v for k, v in IMPORTED_NETWORK.items() if k != "routeTableIds"}
    config = DeployConfig.from_context({"clusterName": "prod", **network, "existingVpcEndpoints": "s3"})
    assert config.route_table_ids == ()


def test_every_bad_key_is_reported_at_once_by_its_context_name() -> None:
    with pytest.raises(ConfigError) as info:
        DeployConfig.from_context(
            {
                "vpcId": "vpc-12",
                "clusterSecurityGroupId": "sg-9",
                "lambdaArchitecture": "sparc",
                "extenderWeight": "heavy",
                "logRetentionDays": 2,
                "alarmEmail": "ops@example.com",
                "alarmTopicArn": "arn:aws:sns:us-east-1:111122223333:alarms",
            }
        )
    message = str(info.value)
    for expected in (
        "clusterName: required",
        "vpcId: expected vpc- and 8 or 17 hex digits, got 'vpc-12'",
        "subnetIds: required with vpcId",
        "clusterSecurityGroupId: expected sg- and 8 or 17 hex digits, got 'sg-9'",
        "lambdaArchitecture: expected arm64 or x86_64, got 'sparc'",
        "extenderWeight: expected an integer, got 'heavy'",
        "logRetentionDays: expected one of",
        "alarmEmail, alarmTopicArn: give one",
    ):
        assert expected in message


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        (
            {"extenderProvisionedConcurrency": 30},
            "extenderProvisionedConcurrency: expected 0..extenderReservedConcurrency",
        ),
        ({"extenderWeight": 0}, "extenderWeight: expected an integer in 1..100, got 0"),
        ({"schedulerImage": "kube scheduler"}, "schedulerImage: expected a container image reference"),
        ({"maxSnapshotAgeS": 30}, "maxSnapshotAgeS: expected >= 60"),
        ({"nodeStateScheduleMinutes": 0}, "nodeStateScheduleMinutes: expected 1..60 minutes, got 0"),
        ({"deletionCostConfig": {"workloads": []}}, "deletionCostConfig: workloads: expected a non-empty list"),
        ({"deletionCostConfig": "{not json"}, "deletionCostConfig: expected a JSON object"),
        ({"ampWorkspaceId": "prometheus"}, "ampWorkspaceId: expected ws-..., got 'prometheus'"),
        ({"sharePolicy": "fgd"}, "sharePolicy: share policy 'fgd': expected one of fgd_cpu, gpu_packing, bestfit"),
        ({"reservationImage": "py' || true"}, "reservationImage: expected a container image reference or 'none'"),
        (
            {**IMPORTED_NETWORK, "schedulerSecurityGroupId": "", "schedulerNodeSelector": "role=scheduler"},
            "schedulerSecurityGroupId: required with schedulerNodeSelector (the security group of the node group",
        ),
        (
            {**IMPORTED_NETWORK, "schedulerNodeSelector": "role"},
            "schedulerNodeSelector: expected key=value items, got 'role'",
        ),
        (
            {**IMPORTED_NETWORK, "schedulerNodeSelector": "bad key=x"},
            "schedulerNodeSelector: expected label keys and values",
        ),
        (
            {**IMPORTED_NETWORK, "schedulerSecurityGroupId": IMPORTED_NETWORK["clusterSecurityGroupId"]},
            "schedulerSecurityGroupId: must not be the cluster security group",
        ),
        (
            {**IMPORTED_NETWORK, "routeTableIds": ""},
            "routeTableIds: required with vpcId for the s3 gateway endpoint (the private",
        ),
        ({**IMPORTED_NETWORK, "routeTableIds": "rtb-1"}, "routeTableIds: expected rtb- and 8 or 17 hex digits"),
        ({"schedulerSecurityGroupId": "sg-0dddddddddddddddd"}, "vpcId: required when schedulerSecurityGroupId"),
        ({"existingVpcEndpoints": "s3,kinesis"}, "existingVpcEndpoints: expected some of s3, dynamodb"),
        (
            {**IMPORTED_NETWORK, "executeApiEndpointId": "vpce-0eeeeeeeeeeeeeeee"},
            "schedulerSecurityGroupId: not used with executeApiEndpointId",
        ),
        ({**IMPORTED_NETWORK, "executeApiEndpointId": "endpoint"}, "executeApiEndpointId: expected vpce- and"),
        (
            {
                **IMPORTED_NETWORK,
                "schedulerSecurityGroupId": "",
                "executeApiEndpointId": "vpce-0eeeeeeeeeeeeeeee",
                "executeApiPrivateDns": "true",
            },
            "executeApiPrivateDns: applies only to the endpoint this stack creates",
        ),
        ({"vpcEndpointPrivateDns": "sometimes"}, "vpcEndpointPrivateDns: expected true or false, got 'sometimes'"),
        (
            {"vpcEndpointPrivateDns": True, "existingVpcEndpoints": ",".join(INTERFACE_SERVICES)},
            "vpcEndpointPrivateDns: applies only to the interface endpoints this stack creates, and "
            "existingVpcEndpoints lists all of them",
        ),
        ({"dcgmExporterNamespace": "GPU_Operator"}, "dcgmExporterNamespace: expected a Kubernetes namespace name"),
        ({"kubeStateMetricsNamespace": "-x"}, "kubeStateMetricsNamespace: expected a Kubernetes namespace name"),
        (
            {"nodeStateWatchS": 45},
            "nodeStateWatchS: expected 0 (no watch) or more than the schedule's 60 s",
        ),
        (
            {"nodeStateScheduleMinutes": 5, "nodeStateWatchS": 120},
            "nodeStateWatchS: expected 0 (no watch) or more than the schedule's 300",
        ),
        ({"nodeStateWatchS": 1000}, "at most 870; got 1000"),
    ],
    ids=[
        "provisioned concurrency cannot exceed the reserved",
        "weight zero is refused",
        "an image with spaces is refused",
        "a snapshot bound under the refresh period is refused",
        "a zero-minute schedule is refused",
        "an empty deletion-cost config is refused",
        "deletion-cost config that is not JSON is refused",
        "a workspace id without ws- is refused",
        "a share policy that needs the whole workload is refused",
        "a reservation image that is no image reference is refused (it goes into an admission policy)",
        "a node selector needs its node group's security group",
        "a node selector item needs key=value",
        "a node selector label key is checked",
        "the cluster security group cannot be the scheduler's",
        "gateway endpoints need the route tables",
        "a route table id is checked",
        "network ids without a VPC are refused",
        "an unknown endpoint service is refused",
        "an imported api endpoint keeps its own security group",
        "an imported api endpoint id is checked",
        "private DNS cannot be set on an imported endpoint",
        "service-endpoint private DNS is true or false",
        "service-endpoint private DNS needs an endpoint this stack creates",
        "a namespace with capitals is refused",
        "a namespace starting with a dash is refused",
        "a watch shorter than the schedule would leave gaps",
        "a longer schedule needs a longer watch, or none",
        "a watch past Lambda's 15 minutes is refused",
    ],
)
def test_invalid_values_name_their_key(context: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        DeployConfig.from_context({"clusterName": "prod", **context})


def test_the_keys_passed_to_the_extender_take_its_declared_default_and_reach_its_environment() -> None:
    from dataclasses import fields

    from adapters.settings import context_keys, default_of, environment
    from application.extender.settings import ExtenderSettings
    from cdk.config import _camel

    deploy_fields = {f.name: f for f in fields(DeployConfig)}
    assert context_keys(ExtenderSettings) == {
        "max_snapshot_age_s": "maxSnapshotAgeS", "share_policy": "sharePolicy", "reservation_image": "reservationImage",
        "share_device": "shareDevice",
    }  # fmt: skip
    for name, key in context_keys(ExtenderSettings).items():
        assert _camel(name) == key  # the context key DeployConfig reads for its field of that name
        assert deploy_fields[name].default == default_of(ExtenderSettings, name)
        assert deploy_fields[name].type == next(f.type for f in fields(ExtenderSettings) if f.name == name), name
    config = DeployConfig.from_context(
        {"clusterName": "c", "sharePolicy": "bestfit", "maxSnapshotAgeS": "240", "reservationImage": "r.example/p:1",
         "shareDevice": "env"}
    )  # fmt: skip
    assert environment(ExtenderSettings, config) == {
        "MAX_SNAPSHOT_AGE_S": "240", "SHARE_POLICY": "bestfit", "RESERVATION_IMAGE": "r.example/p:1",
        "SHARE_DEVICE": "env",
    }  # fmt: skip
    options = config.scheduler_options("https://x.example/p")
    assert (options.reservation_image, options.share_device) == ("r.example/p:1", "env")


def test_the_node_state_refreshers_placeholder_caps_are_deployment_keys_checked_by_its_own_rule() -> None:
    from dataclasses import fields

    from adapters.settings import context_keys, environment
    from application.node_state.settings import NodeStateSettings

    assert context_keys(NodeStateSettings) == {
        "reservation_image": "reservationImage", "placeholders_per_namespace": "placeholdersPerNamespace",
        "placeholders_total": "placeholdersTotal",
    }  # fmt: skip
    deploy_types = {f.name: f.type for f in fields(DeployConfig)}
    for f in fields(NodeStateSettings):  # one type each, the settings' own
        assert f.name not in context_keys(NodeStateSettings) or deploy_types[f.name] == f.type, f.name
    config = DeployConfig.from_context({"clusterName": "c", "placeholdersPerNamespace": "4", "placeholdersTotal": "9"})
    assert environment(NodeStateSettings, config) == {
        "RESERVATION_IMAGE": config.reservation_image, "PLACEHOLDERS_PER_NAMESPACE": "4", "PLACEHOLDERS_TOTAL": "9",
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"placeholdersTotal: expected an integer in 0\.\.10000, got 20000"):
        DeployConfig.from_context({"clusterName": "c", "placeholdersTotal": "20000"})
    with pytest.raises(ConfigError, match=r"shareDevice: expected one of cdi, env, got 'nvlink'"):
        DeployConfig.from_context({"clusterName": "c", "shareDevice": "nvlink"})


def test_a_misspelled_context_key_fails_the_synth_naming_the_one_meant() -> None:
    """A misspelled key was ignored, and its setting silently kept its default; the CDK's own keys pass."""
    with pytest.raises(ConfigError, match=r"sharedDevice: no such context key; did you mean shareDevice\?"):
        DeployConfig.from_context({"clusterName": "c", "sharedDevice": "env"})
    with pytest.raises(ConfigError, match=r"extenderWieght: no such context key; did you mean extenderWeight\?"):
        DeployConfig.from_context({"clusterName": "c", "extenderWieght": "3"})
    cdk_own = {"@aws-cdk/core:stackRelativeExports": True, "aws:cdk:enable-path-metadata": True,
               "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"]}  # fmt: skip
    assert DeployConfig.from_context({"clusterName": "c", **cdk_own}).cluster_name == "c"
