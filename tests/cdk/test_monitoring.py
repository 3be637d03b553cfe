"""The monitoring hook: the alarm topic and the AMP workspace, created or imported."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk.assertions import Template

from cdk.monitoring import Monitoring

from .conftest import bare_stack

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


def test_an_imported_topic_and_workspace_create_nothing() -> None:
    monitoring, template = _build(alarm_topic_arn=TOPIC_ARN, amp_workspace_id="ws-0123abcd")
    template.resource_count_is("AWS::SNS::Topic", 0)
    template.resource_count_is("AWS::APS::Workspace", 0)
    template.has_resource_properties("AWS::CloudWatch::Alarm", {"AlarmActions": [TOPIC_ARN]})
    assert monitoring.workspace_id == "ws-0123abcd"
    assert monitoring.query_url.endswith("/workspaces/ws-0123abcd")
