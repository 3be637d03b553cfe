"""Which GPU labels a node should carry, from GFD or EC2, under fill and enforce."""

from __future__ import annotations

from scheduler_core.k8s.node_labels import GpuInfo, desired_info, gpu_info_from_ec2, label_changes

EC2 = {"p4d.24xlarge": (GpuInfo("A100", 40960, 8), ""), "m5.large": (None, "instance type m5.large has no GPUs")}


def test_gfd_labels_win_over_ec2() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/gpu.count": "8", "node.kubernetes.io/instance-type": "p4d.24xlarge"}  # fmt: skip
    desired = desired_info(labels, EC2)
    assert (desired.info, desired.source) == (GpuInfo("A100", 81920, 8), "gfd")


def test_ec2_fills_in_for_nodes_without_gfd() -> None:
    desired = desired_info({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, EC2)
    assert (desired.info, desired.source) == (GpuInfo("A100", 40960, 8), "ec2")


def test_garbled_gfd_falls_back_to_ec2_and_says_why_when_it_cannot() -> None:
    garbled = {"nvidia.com/gpu.product": "NVIDIA-A100", "nvidia.com/gpu.count": "eight"}
    assert desired_info({**garbled, "node.kubernetes.io/instance-type": "p4d.24xlarge"}, EC2).source == "ec2"
    desired = desired_info(garbled, EC2)
    assert desired.info is None and "garbled" in desired.reason and "instance-type" in desired.reason


def test_unlabelled_reasons() -> None:
    assert desired_info({"node.kubernetes.io/instance-type": "m5.large"}, EC2).reason.endswith("has no GPUs")
    assert "not looked up" in desired_info({"node.kubernetes.io/instance-type": "x1.huge"}, EC2).reason


def test_fill_writes_only_missing_labels_and_enforce_corrects() -> None:
    current = {"gpu.nvidia.com/model": "V100", "gpu.nvidia.com/count": "8", "team": "ml"}
    info = GpuInfo("A100", 40960, 8)
    assert label_changes(current, info, "fill") == {"gpu.nvidia.com/memory": "40960"}
    assert label_changes(current, info, "enforce") == {"gpu.nvidia.com/model": "A100", "gpu.nvidia.com/memory": "40960"}
    assert label_changes(info.labels(), info, "enforce") == {}


def test_ec2_gpu_info_that_is_not_usable() -> None:
    amd = {"Gpus": [{"Name": "Radeon Pro V520", "Manufacturer": "AMD", "Count": 1, "MemoryInfo": {"SizeInMiB": 8192}}]}
    assert "not NVIDIA" in gpu_info_from_ec2("g4ad.xlarge", amd)[1]
    assert "unusable" in gpu_info_from_ec2("x", {"Gpus": [{"Name": "A100", "Manufacturer": "NVIDIA", "Count": 0}]})[1]
