"""GpuInfo lookups against moto's EC2: batching, unknown types, and the cache across invocations."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.ec2_gpu import GpuInfoCatalog
from scheduler_core.k8s.node_labels import GpuInfo


@pytest.fixture
def ec2(aws_session: Any) -> Any:
    return aws_session.client("ec2")


def test_gpu_info_by_instance_type(ec2: Any) -> None:
    found = GpuInfoCatalog(ec2).lookup(["p4d.24xlarge", "g6e.12xlarge", "m5.4xlarge"])
    assert found["p4d.24xlarge"] == (GpuInfo("A100", 40960, 8), "")
    assert found["g6e.12xlarge"][0] == GpuInfo("L40S", 45776, 4)
    assert found["m5.4xlarge"] == (None, "instance type m5.4xlarge has no GPUs")


def test_unknown_types_are_named_and_the_rest_still_answered(ec2: Any) -> None:
    # moto has no p3.2xlarge (DESIGN section 8): EC2 names it, and the batch is re-asked without it.
    found = GpuInfoCatalog(ec2).lookup(["p3.2xlarge", "p5.48xlarge", "bogus.large"])
    assert found["p5.48xlarge"][0] == GpuInfo("H100", 81920, 8)
    assert found["p3.2xlarge"] == (None, "instance type p3.2xlarge does not exist in EC2")
    assert found["bogus.large"][0] is None


def test_batches_of_100_and_a_cache_across_invocations(ec2: Any) -> None:
    all_types = [t["InstanceType"] for page in ec2.get_paginator("describe_instance_types").paginate()
                 for t in page["InstanceTypes"] if t["InstanceType"] != "g5.xlarge"][:250]  # fmt: skip
    catalog = GpuInfoCatalog(ec2)
    found = catalog.lookup(all_types)
    assert set(found) == set(all_types)
    assert catalog.calls == 3  # 100 + 100 + 50
    catalog.lookup([*all_types[:10], "g5.xlarge"])
    assert catalog.calls == 4  # only g5.xlarge was new
    assert catalog.lookup(["g5.xlarge"])["g5.xlarge"][0] == GpuInfo("A10G", 22888, 1)
    assert catalog.calls == 4
