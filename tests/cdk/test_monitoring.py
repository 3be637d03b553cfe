"""Monitoring: the alarm topic and AMP workspace (created or imported), the CloudWatch dashboard and
alarms, the AMP managed scraper and rule groups."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml
from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk.assertions import Template

from adapters.metric_catalogue import CATALOGUE, NAMESPACE, NODE_STATE, spec
from cdk.monitoring import Monitoring
from cdk.prometheus import rule_groups, scrape_configuration
from manifests.scheduler import SCRAPER_USER

from .conftest import IMPORTED_NETWORK, Synth, bare_stack

TOPIC_ARN = "arn:aws:sns:us-east-1:111122223333:platform-alarms"


def _build(**kwargs: str) -> tuple[Monitoring, Template]:
    stack = bare_stack()
    monitoring = Monitoring(stack, "Monitoring", cluster_name="gpu-prod", **kwargs)
    alarm = cloudwatch.Alarm(
        stack,
        "Alarm",
        metric=cloudwatch.Metric(namespace="GpuScheduler", metric_name="RunFailures", period=Duration.minutes(1)),
        threshold=1,
        evaluation_periods=1,
    )
    monitoring.notify(alarm)
    return monitoring, Template.from_stack(stack)


def test_a_new_topic_and_workspace_by_default_with_the_email_subscribed() -> None:
    _, template = _build(alarm_email="oncall@example.com")
    template.has_resource_properties("AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"})
    template.has_resource_properties("AWS::APS::Workspace", {"Alias": "gpu-scheduler-gpu-prod"})
    (topic_id,) = template.find_resources("AWS::SNS::Topic")
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm", {"AlarmActions": [{"Ref": topic_id}], "OKActions": [{"Ref": topic_id}]}
    )


def test_a_new_topic_is_encrypted_with_its_own_rotating_key_that_cloudwatch_may_use() -> None:
    monitoring, template = _build()
    (key_id,) = template.find_resources("AWS::KMS::Key")
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    # CloudWatch alarms publish to the topic: without kms:GenerateDataKey on the key they would fail.
    (key,) = template.find_resources("AWS::KMS::Key").values()
    granted = [s["Action"] for s in key["Properties"]["KeyPolicy"]["Statement"]
               if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}]  # fmt: skip
    assert granted == [["kms:Decrypt", "kms:GenerateDataKey*"]]
    assert monitoring.topic_key is not None


def test_an_imported_topic_and_workspace_create_nothing() -> None:
    monitoring, template = _build(alarm_topic_arn=TOPIC_ARN, amp_workspace_id="ws-0123abcd")
    template.resource_count_is("AWS::SNS::Topic", 0)
    template.resource_count_is("AWS::KMS::Key", 0)
    template.resource_count_is("AWS::APS::Workspace", 0)
    template.has_resource_properties("AWS::CloudWatch::Alarm", {"AlarmActions": [TOPIC_ARN]})
    assert monitoring.workspace_id == "ws-0123abcd"
    assert monitoring.query_url.endswith("/workspaces/ws-0123abcd")


def test_queries_go_to_amps_regional_host_or_to_the_endpoint_named() -> None:
    regional, _ = _build(amp_workspace_id="ws-0123abcd")
    assert regional.query_url.startswith("https://aps-workspaces.${Token[AWS.Region.")
    endpoint = "https://vpce-0123456789abcdef0-ab12cd34.aps-workspaces.us-east-1.vpce.amazonaws.com"
    named, _ = _build(amp_workspace_id="ws-0123abcd", amp_endpoint_url=endpoint)
    assert named.query_url == f"{endpoint}/workspaces/ws-0123abcd"


# The dashboard, alarms, scraper and rules, as the whole stack wires them.


def _joined(value: Any) -> str:
    """A ``Fn::Join`` of strings and tokens as text, each token written as TOKEN."""
    if isinstance(value, str):
        return value
    separator, parts = value["Fn::Join"]
    return separator.join(p if isinstance(p, str) else "TOKEN" for p in parts)


def _dashboard(synthesised: Synth) -> dict[str, Any]:
    (board,) = synthesised.resources("AWS::CloudWatch::Dashboard").values()
    body: dict[str, Any] = json.loads(_joined(board["Properties"]["DashboardBody"]))
    return body


def _graphed(body: dict[str, Any]) -> dict[str, set[tuple[str, str, str]]]:
    """Widget title -> (namespace, metric, statistic) of each plotted metric; expressions as ("expr", text, "")."""
    graphs: dict[str, set[tuple[str, str, str]]] = {}
    for widget in body["widgets"]:
        properties = widget["properties"]
        found = set()
        for line in properties.get("metrics", []):
            options = line[-1] if isinstance(line[-1], dict) else {}
            if "expression" in options:
                found.add(("expr", options["expression"], ""))
                continue
            names = [p for p in line if isinstance(p, str)]
            namespace, name = names[0], names[1]
            found.add((namespace, name, options.get("stat", "")))
        graphs[properties.get("title", "")] = found
    return graphs


def _alarm(synthesised: Synth, name: str) -> dict[str, Any]:
    (alarm,) = [v["Properties"] for k, v in synthesised.resources("AWS::CloudWatch::Alarm").items() if name in k]
    return dict(alarm)


def _single(alarm: dict[str, Any]) -> tuple[str, str, int]:
    """(metric, statistic, period) of an alarm on one labelled metric (CloudFormation's Metrics form)."""
    (line,) = alarm["Metrics"]
    stat = line["MetricStat"]
    return stat["Metric"]["MetricName"], stat["Stat"], stat["Period"]


def test_dashboard_shows_extender_latency_at_three_percentiles_from_lambda_and_handler(
    synth: Callable[..., Synth],
) -> None:
    graphs = _graphed(_dashboard(synth()))
    duration = graphs["Extender latency: Lambda duration"]
    assert {(ns, stat) for ns, name, stat in duration if name == "Duration"} == {
        ("AWS/Lambda", "p50"), ("AWS/Lambda", "p90"), ("AWS/Lambda", "p99"),
    }  # fmt: skip
    handler = graphs["Extender latency: filter and prioritize in the handler"]
    assert {(NAMESPACE, "FilterLatencyMs", p) for p in ("p50", "p90", "p99")} <= handler
    api = {name for _, name, _ in graphs["Extender latency: at API Gateway (p99 alarm at 1 s)"]}
    assert api == {"Latency", "IntegrationLatency"}
    errors = {name for _, name, _ in graphs["Errors and throttles"]}
    assert errors == {"4XXError", "5XXError", "Errors", "Throttles", "BadRequests", "InternalErrors"}


def test_dashboard_covers_what_operators_ask(synth: Callable[..., Synth]) -> None:
    graphs = _graphed(_dashboard(synth()))
    plotted = {name for lines in graphs.values() for _, name, _ in lines}
    assert {"NodesFeasible", "SnapshotAgeSeconds", "RunMs", "NodesLabeled", "LabelPatchFailures", "CostPatches",
            "RunFailures", "AmpQueryMs", "LedgerConflicts", "PodsByCostRange"} <= plotted  # fmt: skip
    (search,) = graphs["Unschedulable pods by reason"]
    assert search[0] == "expr" and 'MetricName="Unschedulable"' in search[1] and "service,reason" in search[1]
    assert {"Binds", "BindLatencyMs", "BindRollbacks"} <= plotted
    (refused,) = graphs["Binds refused, by reason"]
    assert 'MetricName="BindFailures"' in refused[1] and "service,reason" in refused[1]
    (drift,) = graphs["GPU-ledger drift corrected, by kind"]
    assert 'MetricName="LedgerDrift"' in drift[1] and f'service="{NODE_STATE}"' in drift[1]


def test_every_custom_metric_on_the_dashboard_is_catalogued(synth: Callable[..., Synth]) -> None:
    body = _dashboard(synth())
    for widget in body["widgets"]:
        for line in widget["properties"].get("metrics", []):
            names = [p for p in line if isinstance(p, str)]
            if names and names[0] == NAMESPACE:
                dimensions = dict(zip(names[2::2], names[3::2], strict=True))
                item = spec(names[1], dimensions["service"])
                assert set(dimensions) == set(item.all_dimensions), names


def test_cost_distribution_widget_plots_every_range(synth: Callable[..., Synth]) -> None:
    body = _dashboard(synth())
    (widget,) = [
        w for w in body["widgets"] if w["properties"].get("title", "").startswith("Deletion-cost distribution")
    ]
    ranges = {line[line.index("range") + 1] for line in widget["properties"]["metrics"]}
    assert ranges == {"warming", "default", "medium", "high"}


def test_alarms_have_their_thresholds_and_notify_the_topic_both_ways(synth: Callable[..., Synth]) -> None:
    synthesised = synth(maxSnapshotAgeS=240, ledgerConflictsAlarmPer5m=80)
    (topic,) = synthesised.resources("AWS::SNS::Topic")
    rate = _alarm(synthesised, "Extender5xxRate")
    assert rate["Threshold"] == 1 and rate["DatapointsToAlarm"] == 3 and rate["EvaluationPeriods"] == 5
    (expression,) = [m["Expression"] for m in rate["Metrics"] if "Expression" in m]
    assert expression == "IF(requests > 0, 100 * errors / requests, 0)"
    assert {m["MetricStat"]["Metric"]["MetricName"] for m in rate["Metrics"] if "MetricStat" in m} == {
        "5XXError", "Count",
    }  # fmt: skip
    p99 = _alarm(synthesised, "ExtenderLatencyP99")
    assert (p99["MetricName"], p99["ExtendedStatistic"], p99["Threshold"]) == ("Latency", "p99", 1000)
    stale = _alarm(synthesised, "SnapshotStale")
    assert (_single(stale), stale["Threshold"]) == (("SnapshotAgeSeconds", "Maximum", 60), 240)
    conflicts = _alarm(synthesised, "LedgerConflictSpike")
    assert (_single(conflicts), conflicts["Threshold"]) == (("LedgerConflicts", "Sum", 300), 80)
    for name in ("NodeStateFailing", "DeletionCostFailing"):
        failing = _alarm(synthesised, name)
        assert failing["Threshold"] == 2  # > 2: three or more failed runs in 5 minutes
        names = {m["MetricStat"]["Metric"]["MetricName"] for m in failing["Metrics"] if "MetricStat" in m}
        assert names == {"Errors", "RunFailures"}
    alarms = synthesised.resources("AWS::CloudWatch::Alarm").values()
    assert len(alarms) == 8  # the six here and one per refresher DLQ
    for alarm in alarms:
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic}]
        assert alarm["Properties"]["OKActions"] == [{"Ref": topic}]


def test_the_scraper_scrapes_the_cluster_into_the_workspace_with_the_generated_configuration(
    synth: Callable[..., Synth],
) -> None:
    synthesised = synth(**IMPORTED_NETWORK)
    (scraper,) = synthesised.resources("AWS::APS::Scraper").values()
    props = scraper["Properties"]
    eks = props["Source"]["EksConfiguration"]
    assert eks["SubnetIds"] == IMPORTED_NETWORK["subnetIds"].split(",")
    assert eks["SecurityGroupIds"] == [IMPORTED_NETWORK["clusterSecurityGroupId"]]
    assert _joined(eks["ClusterArn"]).endswith(":cluster/gpu-prod")
    (workspace,) = synthesised.resources("AWS::APS::Workspace")
    assert workspace in json.dumps(props["Destination"]["AmpConfiguration"]["WorkspaceArn"])
    blob = props["ScrapeConfiguration"]["ConfigurationBlob"]["Fn::Base64"]
    assert yaml.safe_load(blob) == scrape_configuration()
    jobs = {job["job_name"]: job for job in yaml.safe_load(blob)["scrape_configs"]}
    assert set(jobs) == {"gpu-scheduler", "dcgm-exporter", "kube-state-metrics"}
    assert jobs["gpu-scheduler"]["scheme"] == "https"
    assert "metric_relabel_configs" in jobs["kube-state-metrics"]
    (entry,) = [
        e["Properties"]
        for e in synthesised.resources("AWS::EKS::AccessEntry").values()
        if e["Properties"].get("Username") == SCRAPER_USER
    ]
    (scraper_id,) = synthesised.resources("AWS::APS::Scraper")
    assert entry["PrincipalArn"] == {"Fn::GetAtt": [scraper_id, "RoleArn"]}


def test_the_exporters_namespaces_come_from_context(synth: Callable[..., Synth]) -> None:
    synthesised = synth(dcgmExporterNamespace="nvidia-gpu", kubeStateMetricsNamespace="monitoring")
    (scraper,) = synthesised.resources("AWS::APS::Scraper").values()
    blob = yaml.safe_load(scraper["Properties"]["ScrapeConfiguration"]["ConfigurationBlob"]["Fn::Base64"])
    jobs = {job["job_name"]: job for job in blob["scrape_configs"]}
    assert jobs["dcgm-exporter"]["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["nvidia-gpu"]}
    assert jobs["kube-state-metrics"]["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["monitoring"]}
    assert blob == scrape_configuration(dcgm_namespace="nvidia-gpu", ksm_namespace="monitoring")


def test_the_rule_groups_are_the_generated_ones(synth: Callable[..., Synth]) -> None:
    synthesised = synth()
    (rules,) = synthesised.resources("AWS::APS::RuleGroupsNamespace").values()
    assert yaml.safe_load(rules["Properties"]["Data"]) == rule_groups()
    names = [group["name"] for group in yaml.safe_load(rules["Properties"]["Data"])["groups"]]
    assert names == ["gpu-scheduler-recording", "gpu-scheduler-alerts"]


def test_the_catalogue_names_each_metric_once_per_service() -> None:
    keys = [(m.name, m.service) for m in CATALOGUE]
    assert len(keys) == len(set(keys))
