"""A scheduled refresher on its own: schedule, retries, DLQ and its alarm."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from cdk.refreshers import DeadLetterQueue, ScheduledRefresher

from .conftest import bare_stack, inline_function


def _template() -> Template:
    stack = bare_stack()
    function = inline_function(stack)
    ScheduledRefresher(stack, "Refresher", function=function, dlq=DeadLetterQueue(stack, "Dlq"), rate_minutes=5)
    return Template.from_stack(stack)


TEMPLATE = _template()


def _ref(kind: str) -> dict[str, list[str]]:
    (logical_id,) = TEMPLATE.find_resources(kind)
    return {"Fn::GetAtt": [logical_id, "Arn"]}


def test_rule_runs_at_the_rate_with_bounded_retries_and_a_dlq() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(5 minutes)",
            "State": "ENABLED",
            "Targets": [
                Match.object_like(
                    {
                        "Arn": _ref("AWS::Lambda::Function"),
                        "DeadLetterConfig": {"Arn": _ref("AWS::SQS::Queue")},
                        "RetryPolicy": {"MaximumEventAgeInSeconds": 300, "MaximumRetryAttempts": 2},
                    }
                )
            ],
        },
    )


def test_a_failed_run_is_not_retried_by_lambda_because_the_next_tick_redoes_it() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig", {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 300}
    )


def test_dlq_is_encrypted_tls_only_and_kept_two_weeks() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::SQS::Queue", {"SqsManagedSseEnabled": True, "MessageRetentionPeriod": 14 * 24 * 3600}
    )
    TEMPLATE.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )


def test_eventbridge_may_send_to_the_dlq_only_for_this_rule() -> None:
    (rule_id,) = TEMPLATE.find_resources("AWS::Events::Rule")
    TEMPLATE.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "sqs:SendMessage",
                                "Principal": {"Service": "events.amazonaws.com"},
                                "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [rule_id, "Arn"]}}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_alarm_fires_on_any_message_in_the_dlq() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "Namespace": "AWS/SQS",
            "Threshold": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "EvaluationPeriods": 1,
            "TreatMissingData": "notBreaching",
        },
    )
