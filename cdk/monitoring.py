"""Monitoring: where alarms go, the CloudWatch dashboard and alarms, and Amazon Managed Prometheus
(workspace, managed scraper, rule groups).

Other units hand their alarms to :meth:`Monitoring.notify`; :meth:`Monitoring.observe` builds the rest
once the functions and the API exist. CloudWatch metrics are named only through
``adapters/metric_catalogue.py``; PromQL lives in ``cdk/prometheus.py`` and the Grafana dashboards in
``cdk/grafana.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import Aws, Duration, Fn, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_aps as aps
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from adapters.metric_catalogue import CONSOLIDATOR, DELETION_COST, EXTENDER, NAMESPACE, NODE_STATE, spec
from cdk.prometheus import DCGM_NAMESPACE, KSM_NAMESPACE, rule_groups, scrape_configuration
from manifests.scheduler import SCRAPER_USER, dump_yaml
from scheduler_core.deletion_cost.policy import COST_RANGES

MINUTE = Duration.minutes(1)
FIVE_MINUTES = Duration.minutes(5)


def metric(
    name: str, service: str, statistic: str = "Sum", period: Duration = MINUTE, **dimensions: str
) -> cloudwatch.Metric:
    """A catalogued EMF metric (KeyError for one the Lambdas do not emit)."""
    item = spec(name, service)
    return cloudwatch.Metric(
        namespace=NAMESPACE,
        metric_name=item.name,
        dimensions_map={"service": service, **dimensions},
        statistic=statistic,
        period=period,
        label=f"{item.name} {statistic}" + "".join(f" {v}" for v in dimensions.values()),
    )


@dataclass(frozen=True)
class Watched:
    """What :meth:`Monitoring.observe` watches."""

    extender: lambda_.Function
    node_state: lambda_.Function
    deletion_cost: lambda_.Function
    stage: apigw.Stage
    max_snapshot_age_s: float
    ledger_conflicts_per_5m: int = 50


class Monitoring(Construct):
    """Attributes: ``topic`` (alarms), ``topic_key`` (its KMS key; None when imported), ``workspace_id``,
    ``workspace_arn``, ``query_url`` (AMP).

    ``alarm_topic_arn`` imports a topic; otherwise one is created, encrypted with its own KMS key that
    CloudWatch may use, with ``alarm_email`` subscribed if given. ``amp_workspace_id`` imports a workspace;
    otherwise one is created. ``amp_endpoint_url`` (``https://`` and a host) replaces AMP's regional
    hostname in ``query_url``: an ``aps-workspaces`` interface endpoint's own name, when its private DNS
    is off.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        alarm_email: str = "",
        alarm_topic_arn: str = "",
        amp_workspace_id: str = "",
        amp_endpoint_url: str = "",
    ) -> None:
        super().__init__(scope, construct_id)
        self.topic_key: kms.Key | None = None
        if alarm_topic_arn:
            self.topic: sns.ITopic = sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn)
        else:
            # A customer managed key: CloudWatch cannot publish to a topic under the AWS managed key
            # (alias/aws/sns), whose key policy cannot grant it kms:GenerateDataKey.
            self.topic_key = kms.Key(
                self,
                "AlarmTopicKey",
                description=f"gpu-scheduler alarm topic ({cluster_name})",
                enable_key_rotation=True,
                removal_policy=RemovalPolicy.DESTROY,  # it encrypts messages in flight only
                pending_window=Duration.days(7),
            )
            self.topic_key.grant(
                iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*"
            )
            topic = sns.Topic(
                self,
                "AlarmTopic",
                display_name=f"gpu-scheduler alarms ({cluster_name})",
                enforce_ssl=True,
                master_key=self.topic_key,
            )
            if alarm_email:
                topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
            self.topic = topic
        if amp_workspace_id:
            self.workspace_id = amp_workspace_id
        else:
            workspace = aps.CfnWorkspace(self, "Prometheus", alias=f"gpu-scheduler-{cluster_name}")
            self.workspace_id = workspace.attr_workspace_id
        self.workspace_arn = f"arn:{Aws.PARTITION}:aps:{Aws.REGION}:{Aws.ACCOUNT_ID}:workspace/{self.workspace_id}"
        amp = amp_endpoint_url or f"https://aps-workspaces.{Aws.REGION}.{Aws.URL_SUFFIX}"
        self.query_url = f"{amp}/workspaces/{self.workspace_id}"

    def observe(self, watched: Watched) -> None:
        """The CloudWatch dashboard and the alarms on the extender, the refreshers and the ledger.

        Attributes set: ``dashboard``, ``alarms`` (by name).
        """
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._alarms(watched)
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", default_interval=Duration.hours(3), widgets=_widgets(watched, self.alarms)
        )

    def scrape(
        self,
        *,
        cluster_name: str,
        cluster_arn: str,
        subnet_ids: Sequence[str],
        security_group_ids: Sequence[str],
        dcgm_namespace: str = DCGM_NAMESPACE,
        ksm_namespace: str = KSM_NAMESPACE,
    ) -> None:
        """The AMP managed scraper for the cluster and the rule groups AMP evaluates. The DCGM exporter and
        kube-state-metrics are scraped only in ``dcgm_namespace`` and ``ksm_namespace``.

        The scraper's role gets an access entry as ``aps-collector-user``, the user the RBAC in
        ``manifests.scheduler.scraper_rbac`` binds. Attributes set: ``scraper``, ``rules``,
        ``scraper_access_entry``.
        """
        self.scraper = aps.CfnScraper(
            self,
            "Scraper",
            alias=f"gpu-scheduler-{cluster_name}",
            source=aps.CfnScraper.SourceProperty(
                eks_configuration=aps.CfnScraper.EksConfigurationProperty(
                    cluster_arn=cluster_arn, subnet_ids=list(subnet_ids), security_group_ids=list(security_group_ids)
                )
            ),
            destination=aps.CfnScraper.DestinationProperty(
                amp_configuration=aps.CfnScraper.AmpConfigurationProperty(workspace_arn=self.workspace_arn)
            ),
            # CloudFormation takes the configuration file base64-encoded.
            scrape_configuration=aps.CfnScraper.ScrapeConfigurationProperty(
                configuration_blob=Fn.base64(
                    dump_yaml(scrape_configuration(dcgm_namespace=dcgm_namespace, ksm_namespace=ksm_namespace))
                )
            ),
        )
        self.scraper_access_entry = eks.CfnAccessEntry(
            self,
            "ScraperAccessEntry",
            cluster_name=cluster_name,
            principal_arn=self.scraper.attr_role_arn,
            username=SCRAPER_USER,
            type="STANDARD",
        )
        self.rules = aps.CfnRuleGroupsNamespace(
            self, "Rules", name="gpu-scheduler", workspace=self.workspace_arn, data=dump_yaml(rule_groups())
        )

    def _alarms(self, watched: Watched) -> None:
        """Every alarm, each sent to the topic: the extender API's errors and latency, a stale snapshot,
        failing refreshers, and a spike of GPU-ledger conflicts."""
        self._api_alarms(watched.stage)
        self._alarm(
            "SnapshotStale",
            f"the extender is deciding from a snapshot older than {watched.max_snapshot_age_s:g} s "
            "(node-state refresher failing or not running?)",
            metric("SnapshotAgeSeconds", EXTENDER, "Maximum"),
            watched.max_snapshot_age_s,
            3,
            2,
        )
        self._failing("NodeStateFailing", watched.node_state, NODE_STATE)
        self._failing("DeletionCostFailing", watched.deletion_cost, DELETION_COST)
        self._alarm(
            "LedgerConflictSpike",
            f"more than {watched.ledger_conflicts_per_5m} GPU-ledger conflicts in 5 minutes: binds are contending",
            metric("LedgerConflicts", EXTENDER, period=FIVE_MINUTES),
            watched.ledger_conflicts_per_5m,
            1,
            1,
        )

    def _failing(self, name: str, function: lambda_.Function, service: str) -> None:
        """An alarm on a scheduled function's failed runs: crashes, and runs that report failure."""
        self._alarm(
            name,
            f"{service}: 3 or more failed runs in 5 minutes (crashes or runs reporting failure)",
            cloudwatch.MathExpression(
                expression="FILL(crashes, 0) + FILL(failures, 0)",
                using_metrics={
                    "crashes": function.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
                    "failures": metric("RunFailures", service, period=FIVE_MINUTES),
                },
                label="failed runs",
                period=FIVE_MINUTES,
            ),
            2,
            1,
            1,
        )

    def observe_consolidation(self, function: lambda_.Function) -> None:
        """With ``consolidation``: an alarm on its failed runs, and a dashboard row of what it planned,
        evicted and held (after :meth:`observe`)."""
        self._failing("ConsolidationFailing", function, CONSOLIDATOR)
        self.dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown="## Consolidation: what waited, what moved, what was held", width=24, height=1
            ),
            _graph("Pending pods and plans", [metric(n, CONSOLIDATOR) for n in ("PendingPods", "Plans")], width=6),
            _graph(
                "Moves", [metric(n, CONSOLIDATOR) for n in ("MovesPlanned", "Evictions", "EvictionsRefused")], width=6
            ),
            _graph("Holds", [metric(n, CONSOLIDATOR) for n in ("HoldsKept", "HoldsLapsed")], width=6),
            cloudwatch.AlarmStatusWidget(
                title="Consolidation", alarms=[self.alarms["ConsolidationFailing"]], width=6, height=6
            ),
        )

    def _api_alarms(self, stage: apigw.Stage) -> None:
        """The extender as kube-scheduler sees it, at API Gateway: 5xx answers and p99 latency."""
        self._alarm(
            "Extender5xxRate",
            "more than 1% of extender API calls answer 5xx: kube-scheduler fails those scheduling cycles",
            cloudwatch.MathExpression(
                expression="IF(requests > 0, 100 * errors / requests, 0)",
                using_metrics={
                    "errors": stage.metric_server_error(period=MINUTE, statistic="Sum"),
                    "requests": stage.metric_count(period=MINUTE, statistic="SampleCount"),
                },
                label="5xx %",
                period=MINUTE,
            ),
            1,
            5,
            3,
        )
        self._alarm(
            "ExtenderLatencyP99",
            "extender p99 over 1 s, measured at API Gateway (kube-scheduler's httpTimeout is 3 s)",
            stage.metric_latency(period=MINUTE, statistic="p99"),
            1000,
            5,
            3,
        )

    def _alarm(
        self, name: str, description: str, metric_: cloudwatch.IMetric, threshold: float, periods: int, datapoints: int
    ) -> None:
        """An alarm above ``threshold`` in ``datapoints`` of ``periods``, missing data not breaching; sent to
        the topic and kept in ``alarms``."""
        created = cloudwatch.Alarm(
            self,
            name,
            alarm_description=description,
            metric=metric_,
            threshold=threshold,
            evaluation_periods=periods,
            datapoints_to_alarm=datapoints,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.notify(created)
        self.alarms[name] = created

    def notify(self, alarm: cloudwatch.Alarm) -> None:
        """Send this alarm's state changes (alarm and back to OK) to the topic."""
        action = cw_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)


def _by_dimension(name: str, service: str, dimension: str) -> cloudwatch.MathExpression:
    """One line per value of ``dimension`` that ``name`` has carried, whatever values appear."""
    if dimension not in spec(name, service).dimensions:
        raise KeyError(f"metric {name!r} of {service!r} has no {dimension!r} dimension")
    return cloudwatch.MathExpression(
        expression=(
            f"SEARCH('{{{NAMESPACE},service,{dimension}}} MetricName=\"{name}\" service=\"{service}\"', 'Sum', 300)"
        ),
        using_metrics={},
        label="",
        period=FIVE_MINUTES,
    )


def _graph(
    title: str,
    metrics: Sequence[cloudwatch.IMetric],
    *,
    width: int = 8,
    unit: str = "",
    annotations: Sequence[cloudwatch.HorizontalAnnotation] = (),
    stacked: bool = False,
) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(
        title=title,
        left=list(metrics),
        width=width,
        height=6,
        stacked=stacked,
        left_y_axis=cloudwatch.YAxisProps(label=unit, show_units=False) if unit else None,
        left_annotations=list(annotations) or None,
    )


def _widgets(watched: Watched, alarms: Mapping[str, cloudwatch.Alarm]) -> list[list[cloudwatch.IWidget]]:
    """The dashboard's three rows: the extender, the refreshers, the GPU ledger and scale-down order."""
    return [_extender_row(watched, alarms), _refresher_row(watched), _state_row()]


def _extender_row(watched: Watched, alarms: Mapping[str, cloudwatch.Alarm]) -> list[cloudwatch.IWidget]:
    """Is kube-scheduler getting fast, correct answers: latency at each layer, errors, what the filter sees,
    the snapshot's age and the alarms' states."""
    stage, extender = watched.stage, watched.extender
    percentiles = ("p50", "p90", "p99")
    unschedulable = _by_dimension("Unschedulable", EXTENDER, "reason")
    return [
        cloudwatch.TextWidget(
            markdown="## Extender: is kube-scheduler getting fast, correct answers?", width=24, height=1
        ),
        _graph(
            "Extender latency: Lambda duration",
            [extender.metric_duration(statistic=p, period=MINUTE) for p in percentiles],
            unit="ms",
        ),
        _graph(
            "Extender latency: filter and prioritize in the handler",
            [metric("FilterLatencyMs", EXTENDER, p) for p in percentiles]
            + [metric("PrioritizeLatencyMs", EXTENDER, "p99")],
            unit="ms",
        ),
        _graph(
            "Extender latency: at API Gateway (p99 alarm at 1 s)",
            [stage.metric_latency(statistic=p, period=MINUTE) for p in percentiles]
            + [stage.metric_integration_latency(statistic="p99", period=MINUTE)],
            unit="ms",
            annotations=[cloudwatch.HorizontalAnnotation(value=1000, label="alarm")],
        ),
        _graph(
            "Errors and throttles",
            [
                stage.metric_client_error(period=MINUTE, statistic="Sum"),
                stage.metric_server_error(period=MINUTE, statistic="Sum"),
                extender.metric_errors(period=MINUTE),
                extender.metric_throttles(period=MINUTE),
                metric("BadRequests", EXTENDER),
                metric("InternalErrors", EXTENDER),
            ],
        ),
        _graph(
            "Nodes per filter call",
            [metric("NodesIn", EXTENDER, "Average"), metric("NodesFeasible", EXTENDER, "Average")],
        ),
        _graph("Unschedulable pods by reason", [unschedulable], stacked=True),
        _graph(
            "Snapshot age",
            [metric("SnapshotAgeSeconds", EXTENDER, "Maximum")],
            unit="s",
            annotations=[cloudwatch.HorizontalAnnotation(value=watched.max_snapshot_age_s, label="bound")],
        ),
        cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms.values()), width=8, height=6),
    ]


def _refresher_row(watched: Watched) -> list[cloudwatch.IWidget]:
    """Is the state fresh and are the writes landing: run durations, label and cost writes, failures, AMP."""
    return [
        cloudwatch.TextWidget(
            markdown="## Refreshers: is the state fresh and are the writes landing?", width=24, height=1
        ),
        _graph(
            "Run duration",
            [
                metric("RunMs", NODE_STATE, "Maximum"),
                metric("RunMs", DELETION_COST, "Maximum"),
                watched.node_state.metric_duration(statistic="Maximum", period=MINUTE),
            ],
            unit="ms",
        ),
        _graph(
            "Node labels",
            [
                metric(n, NODE_STATE)
                for n in ("NodesLabeled", "LabelPatchFailures", "LabelPatchesSkipped", "NodesWithoutGpuInfo")
            ],
        ),
        _graph(
            "Deletion-cost writes",
            [metric(n, DELETION_COST) for n in ("CostPatches", "PatchFailures", "MetricsMissing", "PodsGone")],
        ),
        _graph(
            "Failures",
            [
                metric("RunFailures", NODE_STATE),
                metric("RunFailures", DELETION_COST),
                metric("AmpQueryFailures", NODE_STATE),
                metric("MetricQueryFailures", DELETION_COST),
                watched.node_state.metric_errors(period=MINUTE),
                watched.deletion_cost.metric_errors(period=MINUTE),
            ],
        ),
        _graph("AMP query latency", [metric("AmpQueryMs", NODE_STATE, p) for p in ("p50", "p99")], unit="ms"),
        _graph("Snapshot size", [metric("SnapshotBytes", NODE_STATE, "Maximum")], unit="bytes"),
    ]


def _state_row() -> list[cloudwatch.IWidget]:
    """The GPU ledger (binds, conflicts, refusals, drift) and the deletion-cost distribution."""
    return [
        cloudwatch.TextWidget(markdown="## GPU ledger and scale-down order", width=24, height=1),
        _graph(
            "GPU sharing: binds, conflicts, rollbacks",
            [metric(n, EXTENDER, period=FIVE_MINUTES) for n in ("Binds", "LedgerConflicts", "BindRollbacks")],
            width=6,
        ),
        _graph("Bind latency", [metric("BindLatencyMs", EXTENDER, p) for p in ("p50", "p99")], width=6, unit="ms"),
        _graph("Binds refused, by reason", [_by_dimension("BindFailures", EXTENDER, "reason")], width=6, stacked=True),
        _graph("GPU-ledger drift corrected, by kind", [_by_dimension("LedgerDrift", NODE_STATE, "kind")], width=6),
        _graph(
            "Deletion-cost distribution: managed pods by cost range",
            [metric("PodsByCostRange", DELETION_COST, "Maximum", range=name) for name, _, _ in COST_RANGES],
            width=24,
            stacked=True,
        ),
    ]
