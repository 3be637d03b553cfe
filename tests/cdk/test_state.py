"""The snapshot bucket and the GPU ledger table, built on their own."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from cdk.state import SNAPSHOT_KEY, SchedulerState

from .conftest import bare_stack


def _template() -> tuple[SchedulerState, Template]:
    stack = bare_stack()
    state = SchedulerState(stack, "State", noncurrent_days=5)
    return state, Template.from_stack(stack)


STATE, TEMPLATE = _template()


def test_bucket_is_versioned_encrypted_private_and_expires_old_versions() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "VersioningConfiguration": {"Status": "Enabled"},
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "LifecycleConfiguration": {
                "Rules": [
                    Match.object_like({"NoncurrentVersionExpiration": {"NoncurrentDays": 5}, "Status": "Enabled"})
                ]
            },
        },
    )


def test_bucket_policy_denies_requests_without_tls() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "s3:*",
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            }
        },
    )


def test_ledger_is_on_demand_recoverable_and_encrypted() -> None:
    TEMPLATE.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "KeySchema": [{"AttributeName": "node", "KeyType": "HASH"}],
            "DeletionProtectionEnabled": True,
        },
    )


def test_state_is_kept_when_the_stack_is_deleted() -> None:
    for kind in ("AWS::S3::Bucket", "AWS::DynamoDB::Table"):
        TEMPLATE.has_resource(kind, {"DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"})


def test_snapshot_uri_names_the_bucket_and_key() -> None:
    assert STATE.snapshot_uri.startswith("s3://") and STATE.snapshot_uri.endswith("/" + SNAPSHOT_KEY)
