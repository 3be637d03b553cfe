"""Deployment settings, read once from CDK context into a frozen dataclass.

Every key is optional except ``clusterName``. Values may come from ``cdk.json``, from ``cdk -c key=value``
(strings, parsed here) or from ``CDK_CONTEXT_JSON`` (typed). Validation collects every problem, named by
its context key, and synth stops with all of them at once. A key the extender's settings declare
(``context=`` in ``application/extender/settings.py``) takes its default and its validation from there, and
``cdk/stack.py`` passes it on as the extender's variable.

| key | default | meaning |
|---|---|---|
| ``clusterName`` | (required) | the EKS cluster the scheduler serves |
| ``vpcId`` / ``subnetIds`` | (a demo VPC) | the cluster's VPC; private subnets for the Lambdas and endpoints |
| ``clusterSecurityGroupId`` | (required with ``vpcId``) | the EKS cluster SG: the Lambdas reach the API through it |
| ``schedulerSecurityGroupId`` | (one is made) | the scheduler pods' SG: the only source the API admits |
| ``schedulerNodeSelector`` | (none) | ``k=v,...``: the scheduler pods on a node group in that SG (no SGP) |
| ``routeTableIds`` | (required with ``vpcId``) | the private subnets' route tables, for the gateway endpoints |
| ``existingVpcEndpoints`` | (none) | services whose endpoints the VPC has (``s3``, ``eks``...): not created |
| ``vpcEndpointPrivateDns`` | false | private DNS on the service endpoints it creates (VPC-wide); off: URLs to Lambdas |
| ``executeApiEndpointId`` | (create one) | import an ``execute-api`` endpoint (its SG and policy stay its owner's) |
| ``executeApiPrivateDns`` | false | private DNS on the created ``execute-api`` endpoint (VPC-wide takeover) |
| ``lambdaArchitecture`` | arm64 | ``arm64`` or ``x86_64``; ``make package LAMBDA_ARCH=...`` must match |
| ``nodeStateScheduleMinutes`` / ``deletionCostScheduleMinutes`` | 1 / 1 | EventBridge rates |
| ``nodeStateWatchS`` | the rate + 15 | node-state runs watch until this long after they start (0: poll) |
| ``consolidation`` | false | the consolidator: its Lambda, role, RBAC and admission policy; the extender's holds |
| ``consolidationScheduleMinutes`` | 2 | its EventBridge rate |
| ``consolidationDryRun`` | false | it plans and logs, evicts nothing (``DRY_RUN``): to read its plans first |
| ``ampWorkspaceId`` | (create one) | import an existing Amazon Managed Prometheus workspace |
| ``alarmEmail`` / ``alarmTopicArn`` | (a new topic) | where alarms go |
| ``applyManifests`` | false | apply the RBAC and the second scheduler through ``aws_eks_v2`` |
| ``schedulerImage`` | upstream kube-scheduler | match the cluster's minor version |
| ``sharing`` | false | fractional GPUs: the extender's bind and preempt verbs on the DynamoDB GPU ledger |
| ``sharePolicy`` | ``SHARE_POLICY``'s | the extender's share policy (``SHARE_POLICY``: its default and its check) |
| ``shareDevice`` | cdi | how a share's GPU reaches its containers (``SHARE_DEVICE``; ``docs/sharing.md``) |
| ``placeholdersPerNamespace`` / ``placeholdersTotal`` | 16 / 64 | placeholders standing at once (``PLACEHOLDERS_*``) |
| ``extenderWeight`` | 5 | the extender's weight in kube-scheduler |
| ``extenderGpuPodsOnly`` | false | call the extender for GPU pods only (else for every pod of the profile) |
| ``extenderReservedConcurrency`` | 20 | reserved concurrency of the extender function |
| ``extenderProvisionedConcurrency`` | 0 | provisioned concurrency (0: none; >0 adds a ``live`` alias) |
| ``extenderSnapStart`` | true | SnapStart on the extender's version, behind a ``live`` alias (not with provisioned) |
| ``apiRateLimit`` / ``apiBurstLimit`` | 500 / 1000 | stage throttling, requests per second |
| ``maxSnapshotAgeS`` | ``MAX_SNAPSHOT_AGE_S``'s | the extender refuses an older snapshot; the stale-snapshot alarm |
| ``ledgerConflictsAlarmPer5m`` | 50 | GPU-ledger conflicts in 5 minutes that count as a spike |
| ``logRetentionDays`` | 30 | Lambda and API access logs |
| ``deletionCostConfig`` | metrics policy | the deletion-cost workload config (JSON), stored in SSM |
| ``admissionPolicy`` | true | each Lambda held to its own labels and annotations (Kubernetes 1.30+) |
| ``dcgmExporterNamespace`` | gpu-operator | the only namespace the DCGM exporter is scraped in |
| ``kubeStateMetricsNamespace`` | kube-system | the only namespace kube-state-metrics is scraped in |
| ``packageDir`` | build/lambda | where ``make package`` wrote the bundles |
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from adapters.settings import context_keys, context_names, default_of, parse_bool
from application.extender.settings import ExtenderSettings
from application.node_state.settings import NodeStateSettings
from cdk.functions import RETENTION_NAMES
from cdk.network import GATEWAY_SERVICES, INTERFACE_SERVICES, SERVICES, VPC_WIDE_SERVICES
from cdk.prometheus import DCGM_NAMESPACE, KSM_NAMESPACE
from manifests.scheduler_options import DEFAULT_IMAGE, SchedulerOptions, parse_node_selector
from scheduler_core.deletion_cost.policy import CostConfig
from scheduler_core.errors import ConfigError

WATCH_OVERLAP_S = 15
"""How long a watching node-state run goes on after the next one has started: its cold start and first run."""
NODE_STATE_MAX_WATCH_S = 900 - 30
"""Lambda's 15-minute limit, less the function's margin (the timeout is the watch plus 15 s)."""
DEFAULT_DELETION_COST_CONFIG = {"hysteresis": 10, "workloads": [{"policy": "metrics"}]}
# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = tuple(RETENTION_NAMES)


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    cluster_name: str
    vpc_id: str = ""
    subnet_ids: tuple[str, ...] = ()
    route_table_ids: tuple[str, ...] = ()
    cluster_security_group_id: str = ""
    scheduler_security_group_id: str = ""
    scheduler_node_selector: tuple[str, ...] = ()
    existing_vpc_endpoints: tuple[str, ...] = ()
    vpc_endpoint_private_dns: bool = False
    execute_api_endpoint_id: str = ""
    execute_api_private_dns: bool = False
    lambda_architecture: str = "arm64"
    node_state_schedule_minutes: int = 1
    node_state_watch_s: int = -1  # -1: the node-state rate + WATCH_OVERLAP_S (see watch_s)
    deletion_cost_schedule_minutes: int = 1
    consolidation: bool = False
    consolidation_schedule_minutes: int = 2
    consolidation_dry_run: bool = False
    amp_workspace_id: str = ""
    alarm_email: str = ""
    alarm_topic_arn: str = ""
    apply_manifests: bool = False
    scheduler_image: str = DEFAULT_IMAGE
    sharing: bool = False
    share_policy: str = default_of(ExtenderSettings, "share_policy")  # declared with the extender's settings
    reservation_image: str = default_of(ExtenderSettings, "reservation_image")  # as share_policy
    share_device: str = default_of(ExtenderSettings, "share_device")  # as share_policy
    placeholders_per_namespace: int = default_of(NodeStateSettings, "placeholders_per_namespace")  # as share_policy
    placeholders_total: int = default_of(NodeStateSettings, "placeholders_total")  # as share_policy
    extender_weight: int = 5
    extender_gpu_pods_only: bool = False
    extender_reserved_concurrency: int = 20
    extender_provisioned_concurrency: int = 0
    extender_snap_start: bool = True
    api_rate_limit: int = 500
    api_burst_limit: int = 1000
    max_snapshot_age_s: float = default_of(ExtenderSettings, "max_snapshot_age_s")  # as share_policy
    ledger_conflicts_alarm_per_5m: int = 50
    log_retention_days: int = 30
    deletion_cost_config: Mapping[str, Any] = field(default_factory=lambda: DEFAULT_DELETION_COST_CONFIG)
    admission_policy: bool = True
    dcgm_exporter_namespace: str = DCGM_NAMESPACE
    kube_state_metrics_namespace: str = KSM_NAMESPACE
    package_dir: str = "build/lambda"

    @property
    def demo_vpc(self) -> bool:
        return not self.vpc_id

    @property
    def snap_start(self) -> bool:
        """SnapStart on the extender: ``extenderSnapStart``, unless provisioned concurrency is set (Lambda
        does not take both; provisioned environments are initialised before any request anyway).

        >>> [DeployConfig(cluster_name="c", extender_provisioned_concurrency=n).snap_start for n in (0, 2)]
        [True, False]
        """
        return self.extender_snap_start and not self.extender_provisioned_concurrency

    @property
    def vpc_endpoints(self) -> tuple[str, ...]:
        """The services whose endpoints the stack creates: each one the Lambdas call, less those the VPC has
        (DynamoDB only with sharing: nothing else reads the ledger); with ``vpcEndpointPrivateDns`` also the
        services the VPC's own workloads then reach through them (``cdk.network.VPC_WIDE_SERVICES``).

        >>> DeployConfig(cluster_name="c").vpc_endpoints
        ('s3', 'eks', 'ec2', 'ssm', 'aps-workspaces')
        """
        used = [s for s in SERVICES if s != "dynamodb" or self.sharing]
        if not self.vpc_endpoint_private_dns:
            used = [s for s in used if s not in VPC_WIDE_SERVICES]
        return tuple(s for s in used if s not in self.existing_vpc_endpoints)

    @property
    def watch_s(self) -> int:
        """How long each node-state run watches from its start (0: it does not): ``nodeStateWatchS``, or the
        rate plus :data:`WATCH_OVERLAP_S`, so that the next run starts and writes before this one stops.

        >>> [DeployConfig(cluster_name="c", node_state_schedule_minutes=m).watch_s for m in (1, 2)]
        [75, 135]
        """
        if self.node_state_watch_s < 0:
            return 60 * self.node_state_schedule_minutes + WATCH_OVERLAP_S
        return self.node_state_watch_s

    @property
    def scheduler_pods(self) -> str:
        """How the scheduler pods reach the extender's endpoint (``cdk.network.SCHEDULER_PODS``).

        >>> [DeployConfig(cluster_name="c", **kw).scheduler_pods for kw in (
        ...     {}, {"scheduler_node_selector": ("role=scheduler",)}, {"execute_api_endpoint_id": "vpce-0123abcd"})]
        ['securityGroupPolicy', 'nodeSelector', 'none']
        """
        if self.execute_api_endpoint_id:
            return "none"
        return "nodeSelector" if self.scheduler_node_selector else "securityGroupPolicy"

    @property
    def node_selector(self) -> dict[str, str]:
        """``schedulerNodeSelector``'s ``key=value`` items as a mapping (an item without ``=`` is left to
        :meth:`problems` to name)."""
        return parse_node_selector([item.strip() for item in self.scheduler_node_selector])[0]

    def scheduler_options(self, extender_url: str, security_group: str = "") -> SchedulerOptions:
        """The second scheduler's options; ``security_group`` is the one the endpoint admits (none with an
        imported endpoint, whose owner admits the pods)."""
        return SchedulerOptions(
            extender_url=extender_url,
            security_group=security_group if self.scheduler_pods != "none" else "",
            node_selector=self.node_selector,
            sharing=self.sharing,
            consolidation=self.consolidation,
            weight=self.extender_weight,
            image=self.scheduler_image,
            gpu_pods_only=self.extender_gpu_pods_only,
            reservation_image=self.reservation_image,
            share_device=self.share_device,
        )

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> DeployConfig:
        """Build from context (camelCase keys); raise :class:`ConfigError` naming every bad key.

        >>> DeployConfig.from_context({"clusterName": "prod", "sharing": "false"}).sharing
        False
        """
        problems = unknown_keys(context, {_camel(f.name) for f in fields(cls)})
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = _camel(f.name)
            if key not in context or context[key] in (None, ""):
                continue
            try:
                values[f.name] = _parse(context[key], str(f.type))
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
        if "cluster_name" not in values:
            problems.append("clusterName: required (the EKS cluster's name), e.g. cdk synth -c clusterName=prod")
            values["cluster_name"] = ""
        config = cls(**values)
        problems += config.problems()
        if problems:
            raise ConfigError("; ".join(problems))
        return config

    def _extender_problems(self) -> list[str]:
        """The extender's own validation (``ExtenderSettings.problems``) of the keys the deployment passes
        on to it (those whose settings declare a context key), named by those keys; and the node-state
        refresher's placeholder caps, likewise."""
        passed = {name: getattr(self, name) for name in context_keys(ExtenderSettings)}
        found = ExtenderSettings(**passed).problems(context_names(ExtenderSettings))
        caps = NodeStateSettings(**{name: getattr(self, name) for name in context_keys(NodeStateSettings)})
        return found + caps.placeholder_problems(context_names(NodeStateSettings))

    def problems(self) -> list[str]:
        found = []
        if self.vpc_id and not _is_id(self.vpc_id, "vpc"):
            found.append(f"vpcId: expected vpc- and 8 or 17 hex digits, got {self.vpc_id!r}")
        found += self._network_problems()
        if self.lambda_architecture not in ("arm64", "x86_64"):
            found.append(f"lambdaArchitecture: expected arm64 or x86_64, got {self.lambda_architecture!r}")
        for name in ("node_state_schedule_minutes", "deletion_cost_schedule_minutes", "consolidation_schedule_minutes"):
            if not 1 <= getattr(self, name) <= 60:
                found.append(f"{_camel(name)}: expected 1..60 minutes, got {getattr(self, name)}")
        period_s = 60 * self.node_state_schedule_minutes
        if self.watch_s and not period_s < self.watch_s <= NODE_STATE_MAX_WATCH_S:
            found.append(
                f"nodeStateWatchS: expected 0 (no watch) or more than the schedule's {period_s} s (the next run "
                f"takes over before this one stops), at most {NODE_STATE_MAX_WATCH_S}; got {self.watch_s}"
            )
        if self.alarm_email and self.alarm_topic_arn:
            found.append("alarmEmail, alarmTopicArn: give one (an e-mail makes a new topic)")
        if self.alarm_topic_arn and not self.alarm_topic_arn.startswith("arn:"):
            found.append(f"alarmTopicArn: expected an SNS topic ARN, got {self.alarm_topic_arn!r}")
        if self.alarm_email and "@" not in self.alarm_email:
            found.append(f"alarmEmail: expected an e-mail address, got {self.alarm_email!r}")
        if self.amp_workspace_id and not self.amp_workspace_id.startswith("ws-"):
            found.append(f"ampWorkspaceId: expected ws-..., got {self.amp_workspace_id!r}")
        found += self._extender_problems()
        if self.extender_reserved_concurrency < 1:
            found.append(f"extenderReservedConcurrency: expected >= 1, got {self.extender_reserved_concurrency}")
        if not 0 <= self.extender_provisioned_concurrency <= self.extender_reserved_concurrency:
            found.append(
                "extenderProvisionedConcurrency: expected 0..extenderReservedConcurrency "
                f"({self.extender_reserved_concurrency}), got {self.extender_provisioned_concurrency}"
            )
        if self.api_rate_limit < 1 or self.api_burst_limit < 1:
            found.append(
                f"apiRateLimit, apiBurstLimit: expected >= 1, got {self.api_rate_limit}, {self.api_burst_limit}"
            )
        if self.max_snapshot_age_s < 60:
            found.append(
                f"maxSnapshotAgeS: expected >= 60 (the refresher runs every minute), got {self.max_snapshot_age_s:g}"
            )
        if self.ledger_conflicts_alarm_per_5m < 1:
            found.append(f"ledgerConflictsAlarmPer5m: expected >= 1, got {self.ledger_conflicts_alarm_per_5m}")
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            found.append(f"logRetentionDays: expected one of {LOG_RETENTION_DAYS}, got {self.log_retention_days}")
        for name in ("dcgm_exporter_namespace", "kube_state_metrics_namespace"):
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", getattr(self, name)):
                found.append(f"{_camel(name)}: expected a Kubernetes namespace name, got {getattr(self, name)!r}")
        try:
            CostConfig.from_json(self.deletion_cost_config)
        except ConfigError as exc:
            found.append(f"deletionCostConfig: {exc}")
        # The manifests' own checks (weight, image), with a placeholder URL.
        found += [
            f"{_SCHEDULER_KEYS.get(p.split(':')[0], p.split(':')[0])}:{p.split(':', 1)[1]}"
            for p in self.scheduler_options("https://placeholder").problems()
        ]
        return found

    def _network_problems(self) -> list[str]:
        """The network keys: the cluster's VPC, how the scheduler pods reach the extender's endpoint, and
        the service endpoints."""
        return self._vpc_problems() + self._scheduler_pods_problems() + self._endpoint_problems()

    def _vpc_problems(self) -> list[str]:
        """``vpcId`` and the IDs that go with it: each one given needs it, it needs the subnets, the cluster
        security group and (for gateway endpoints it makes) the route tables; every ID is well formed."""
        found = []
        imported = {
            "subnetIds": self.subnet_ids,
            "routeTableIds": self.route_table_ids,
            "clusterSecurityGroupId": self.cluster_security_group_id,
            "schedulerSecurityGroupId": self.scheduler_security_group_id,
            "executeApiEndpointId": self.execute_api_endpoint_id,
        }
        if not self.vpc_id:
            given = [key for key, value in imported.items() if value]
            if given:
                found.append(
                    f"vpcId: required when {', '.join(given)} are given (they name parts of the cluster's VPC)"
                )
        else:
            if not self.subnet_ids:
                found.append(
                    "subnetIds: required with vpcId (the private subnets for the Lambdas and the VPC endpoints)"
                )
            if not self.cluster_security_group_id:
                found.append(
                    "clusterSecurityGroupId: required with vpcId (the Lambdas reach the cluster API through it)"
                )
            gateways = [s for s in self.vpc_endpoints if s in GATEWAY_SERVICES]
            if gateways and not self.route_table_ids:
                found.append(
                    f"routeTableIds: required with vpcId for the {' and '.join(gateways)} gateway "
                    f"endpoint{'s' if len(gateways) > 1 else ''} (the private subnets' route tables), or list "
                    f"{', '.join(gateways)} in existingVpcEndpoints"
                )
        for key, prefix, values in (
            ("vpcId", "vpc", (self.vpc_id,)),
            ("subnetIds", "subnet", self.subnet_ids),
            ("routeTableIds", "rtb", self.route_table_ids),
            ("clusterSecurityGroupId", "sg", (self.cluster_security_group_id,)),
            ("schedulerSecurityGroupId", "sg", (self.scheduler_security_group_id,)),
            ("executeApiEndpointId", "vpce", (self.execute_api_endpoint_id,)),
        ):
            found += [f"{key}: expected {prefix}- and 8 or 17 hex digits, got {v!r}" for v in values
                      if v and not _is_id(v, prefix)]  # fmt: skip
        return found

    def _scheduler_pods_problems(self) -> list[str]:
        """How the scheduler pods reach the extender's endpoint: their own security group (not the
        cluster's), a node selector with its node group's group, or an imported endpoint that takes neither."""
        found = []
        if self.scheduler_security_group_id and self.scheduler_security_group_id == self.cluster_security_group_id:
            found.append(
                "schedulerSecurityGroupId: must not be the cluster security group, which every pod on managed nodes "
                "carries; give the scheduler pods their own (Security Groups for Pods, or a dedicated node group)"
            )
        bad_items = parse_node_selector(self.scheduler_node_selector)[1]
        if bad_items:
            found.append(f"schedulerNodeSelector: expected key=value items, got {', '.join(map(repr, bad_items))}")
        if self.scheduler_node_selector and not self.scheduler_security_group_id:
            found.append(
                "schedulerSecurityGroupId: required with schedulerNodeSelector (the security group of the node "
                "group the scheduler pods run on: the one source the extender API's endpoint admits)"
            )
        if self.scheduler_node_selector and self.execute_api_endpoint_id:
            found.append(
                "schedulerNodeSelector: not used with executeApiEndpointId (the imported endpoint's owner admits "
                "the scheduler pods)"
            )
        if self.execute_api_endpoint_id and self.scheduler_security_group_id:
            found.append(
                "schedulerSecurityGroupId: not used with executeApiEndpointId (the imported endpoint keeps its own "
                "security group: make it admit only the scheduler pods)"
            )
        return found

    def _endpoint_problems(self) -> list[str]:
        """Private DNS only on endpoints this stack creates, and only services it knows in
        ``existingVpcEndpoints``."""
        found = []
        if self.execute_api_endpoint_id and self.execute_api_private_dns:
            found.append(
                "executeApiPrivateDns: applies only to the endpoint this stack creates, not executeApiEndpointId"
            )
        if self.vpc_endpoint_private_dns and not any(s in INTERFACE_SERVICES for s in self.vpc_endpoints):
            found.append(
                "vpcEndpointPrivateDns: applies only to the interface endpoints this stack creates, and "
                f"existingVpcEndpoints lists all of them ({', '.join(INTERFACE_SERVICES)})"
            )
        unknown = [s for s in self.existing_vpc_endpoints if s not in SERVICES]
        if unknown:
            found.append(f"existingVpcEndpoints: expected some of {', '.join(SERVICES)}, got {', '.join(unknown)}")
        return found


_SCHEDULER_KEYS = {"weight": "extenderWeight", "image": "schedulerImage", "node_selector": "schedulerNodeSelector"}


CDK_KEYS = frozenset({"acknowledged-issue-numbers"})
"""Context keys the CDK CLI itself writes that have neither an ``@`` nor a ``:`` (``cdk acknowledge``)."""


def unknown_keys(context: Mapping[str, Any], known: set[str]) -> list[str]:
    """A problem per context key that is none of ours, each with the nearest key it may have meant (by its
    letters alone: ``cluster_name`` and ``ClusterName`` mean ``clusterName``). The CDK's own keys pass:
    ``@aws-cdk/...``, ``aws:cdk:...``, lookups (with ``:``), and :data:`CDK_KEYS`.

    >>> unknown_keys({"sharedDevice": "cdi", "@aws-cdk/core:x": True}, {"clusterName", "shareDevice"})
    ['sharedDevice: no such context key; did you mean shareDevice?']
    >>> for problem in unknown_keys({"cluster_name": "prod", "share-device": "cdi"}, {"clusterName", "shareDevice"}):
    ...     print(problem)
    cluster_name: no such context key; did you mean clusterName?
    share-device: no such context key; did you mean shareDevice?
    """

    def letters(key: str) -> str:
        return re.sub(r"[^a-z0-9]", "", key.lower())

    by_letters = {letters(key): key for key in known}
    found = []
    for key in sorted(context):
        if key in known or key in CDK_KEYS or key.startswith("@") or ":" in key:
            continue
        near = [by_letters[letters(key)]] if letters(key) in by_letters else []
        near = near or [by_letters[m] for m in difflib.get_close_matches(letters(key), sorted(by_letters), 1, 0.6)]
        found.append(f"{key}: no such context key" + (f"; did you mean {near[0]}?" if near else ""))
    return found


def _is_id(value: str, prefix: str) -> bool:
    """An EC2 resource ID: ``prefix-`` and 8 or 17 lowercase hex digits."""
    return re.fullmatch(rf"{prefix}-([0-9a-f]{{8}}|[0-9a-f]{{17}})", value) is not None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _parse(raw: Any, type_name: str) -> Any:
    """A context value as the field's type; strings (from ``-c key=value``) are parsed."""
    if type_name == "bool":
        if isinstance(raw, bool):
            return raw
        try:
            return parse_bool(str(raw))
        except ValueError:
            raise ValueError(f"expected true or false, got {raw!r}") from None
    if type_name in ("int", "float"):
        number = int if type_name == "int" else float
        expected = "an integer" if number is int else "a number"
        try:
            if isinstance(raw, bool):
                raise TypeError(raw)
            value = number(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected {expected}, got {raw!r}") from None
        if not math.isfinite(value):  # nan passes every comparison, and inf is no age
            raise ValueError(f"expected a finite number, got {raw!r}")
        return value
    if type_name == "tuple[str, ...]":
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"expected a list or a comma list of strings, got {raw!r}")
        return tuple(i.strip() for i in items if i.strip())
    if type_name == "Mapping[str, Any]":
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected a JSON object: {exc}") from None
        if not isinstance(raw, Mapping):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {raw!r}")
    return raw.strip()
