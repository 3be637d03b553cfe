"""Monitoring: where alarms go, and the Amazon Managed Prometheus workspace.

This is the hook the monitoring issue builds on: dashboards, the AMP scraper and rule groups go here.
Other units create their alarms and hand them to :meth:`Monitoring.notify`.
"""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_aps as aps
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct


class Monitoring(Construct):
    """Attributes: ``topic`` (alarms), ``workspace_id``, ``workspace_arn``, ``query_url`` (AMP).

    ``alarm_topic_arn`` imports a topic; otherwise one is created, with ``alarm_email`` subscribed if
    given. ``amp_workspace_id`` imports a workspace; otherwise one is created.
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
    ) -> None:
        super().__init__(scope, construct_id)
        if alarm_topic_arn:
            self.topic: sns.ITopic = sns.Topic.from_topic_arn(self, "AlarmTopic", alarm_topic_arn)
        else:
            topic = sns.Topic(
                self, "AlarmTopic", display_name=f"gpu-scheduler alarms ({cluster_name})", enforce_ssl=True
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
        self.query_url = f"https://aps-workspaces.{Aws.REGION}.{Aws.URL_SUFFIX}/workspaces/{self.workspace_id}"

    def notify(self, alarm: cloudwatch.Alarm) -> None:
        """Send this alarm's state changes (alarm and back to OK) to the topic."""
        action = cw_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
