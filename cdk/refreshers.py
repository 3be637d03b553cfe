"""A refresher Lambda run by EventBridge on a fixed rate, with retries bounded and failures kept."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct


class DeadLetterQueue(sqs.Queue):
    """Encrypted, TLS-only, kept 14 days: long enough to read what failed after a weekend."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(
            scope,
            construct_id,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )


class ScheduledRefresher(Construct):
    """Runs ``function`` every ``rate_minutes``.

    - The invocation is asynchronous. The next tick does the same work, so a failed run is not retried
      by Lambda (``retry_attempts=0``) and an event older than the period is dropped. What fails goes to
      ``dlq``: events EventBridge could not deliver (after ``delivery_attempts``), and runs that raised.
    - ``alarm`` fires when the DLQ holds anything.

    Attributes: ``rule``, ``dlq``, ``alarm``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.Function,
        dlq: sqs.IQueue,
        rate_minutes: int,
        delivery_attempts: int = 2,
    ) -> None:
        super().__init__(scope, construct_id)
        period = Duration.minutes(rate_minutes)
        self.dlq = dlq
        function.configure_async_invoke(max_event_age=period, retry_attempts=0)
        self.rule = events.Rule(
            self,
            "Schedule",
            schedule=events.Schedule.rate(period),
            description=f"run {function.node.path} every {rate_minutes} minute(s)",
            targets=[
                targets.LambdaFunction(
                    function,
                    dead_letter_queue=dlq,
                    max_event_age=period,
                    retry_attempts=delivery_attempts,
                )
            ],
        )
        self.alarm = cloudwatch.Alarm(
            self,
            "DlqNotEmpty",
            alarm_description=f"failed or undelivered runs of {function.node.path} are waiting in its DLQ",
            metric=dlq.metric_approximate_number_of_messages_visible(period=Duration.minutes(5), statistic="Maximum"),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
