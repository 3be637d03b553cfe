"""Shared state: the S3 bucket for the cluster snapshot and the DynamoDB table for the GPU ledger."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

SNAPSHOT_KEY = "snapshot/cluster.snapshot"
HOLDS_KEY = "consolidation/holds.json"


class SchedulerState(Construct):
    """Attributes: ``bucket``, ``snapshot_key``, ``snapshot_uri``, ``snapshot_arn``, ``holds_key``,
    ``holds_uri``, ``holds_arn`` (the consolidator's holds, in the same bucket), ``ledger``.

    - The bucket is versioned, so a bad snapshot can be rolled back by hand. The refresher writes a new
      version every minute, so non-current versions expire after ``noncurrent_days``.
    - The ledger holds one item per node (partition key ``node``): used milli per GPU, assignments by pod
      UID and a version for conditional writes (DESIGN section 5).
    """

    def __init__(self, scope: Construct, construct_id: str, *, noncurrent_days: int = 3) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket(
            self,
            "Snapshots",
            versioned=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-old-snapshots",
                    noncurrent_version_expiration=Duration.days(noncurrent_days),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.snapshot_key = SNAPSHOT_KEY
        self.snapshot_uri = f"s3://{self.bucket.bucket_name}/{SNAPSHOT_KEY}"
        self.snapshot_arn = self.bucket.arn_for_objects(SNAPSHOT_KEY)
        self.holds_key = HOLDS_KEY
        self.holds_uri = f"s3://{self.bucket.bucket_name}/{HOLDS_KEY}"
        self.holds_arn = self.bucket.arn_for_objects(HOLDS_KEY)
        self.ledger = dynamodb.Table(
            self,
            "GpuLedger",
            partition_key=dynamodb.Attribute(name="node", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
