"""What a share's containers are given (``manifests/share_env.py``): the annotations the bind writes, the
env entries that read them, and the admission documents generated around them."""

from __future__ import annotations

import pytest

from gpu_scheduler.cli import main
from manifests.scheduler import all_manifests
from manifests.scheduler_options import SchedulerOptions
from manifests.share_env import (
    MUTATING_APIS,
    SHARE_ENV,
    container_env,
    share_annotations,
    share_env,
    share_env_mutation,
)
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.names import BIND_ANNOTATIONS, CDI_DEVICE_ANNOTATION, VISIBLE_DEVICES_ANNOTATION

URL = "https://x.example/prod"
UUID = "GPU-8a1b2c3d-0000-1111-2222-333344445555"


@pytest.mark.parametrize("device", ["cdi", "env"])
def test_a_shares_containers_read_exactly_what_its_binding_writes(device: str) -> None:
    """Each variable reads one annotation the bind writes, and the containers resolve to the Binding's values;
    the GPU itself comes as the CDI device the Binding names (``cdi``) or through the variable (``env``)."""
    annotations = share_annotations(UUID, 333, 81559, device=device)
    assert set(annotations) <= set(BIND_ANNOTATIONS) and annotations[VISIBLE_DEVICES_ANNOTATION] == UUID
    assert (CDI_DEVICE_ANNOTATION in annotations) is (device == "cdi")
    pod = {"metadata": {"name": "p", "annotations": {**annotations, "other": "x"}}}
    container = {"name": "main", "env": [{"name": "HOME", "value": "/tmp"}, *share_env(device)]}
    sizes = {
        "HOME": "/tmp",
        "GPU_PORTION": "0.333",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "34",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=27159MB",  # floored: the shares of a GPU never add up past it
    }
    assert container_env(pod, container) == (sizes if device == "cdi" else {**sizes, "NVIDIA_VISIBLE_DEVICES": UUID})
    # Before the Binding (or with no reservation pods) the kubelet would resolve them to nothing.
    assert set(container_env({"metadata": {}}, container).values()) == {"/tmp", ""}


def test_a_node_whose_gpu_memory_is_unknown_gets_no_memory_limit_and_a_whole_gpu_is_no_share() -> None:
    assert "gpu-scheduler.io/mps-memory-limit" not in share_annotations(UUID, 500, 0)
    assert share_annotations(UUID, 1, 80000)["gpu-scheduler.io/mps-thread-percentage"] == "1"
    for milli in (0, 1000):
        with pytest.raises(ValueError, match=r"1\.\.999 milli"):
            share_annotations(UUID, milli, 80000)


@pytest.mark.parametrize("uuid", ["all", "GPU-1", "0", "GPU-8a1b2c3d-0000-1111-2222-333344445555,GPU-0"])
def test_no_binding_is_written_for_what_is_not_one_gpus_uuid(uuid: str) -> None:
    with pytest.raises(ValueError, match="is not of the bind's shape"):
        share_annotations(uuid, 250, 80000)


def test_the_mutating_policy_comes_only_when_asked_in_a_served_version() -> None:
    def kinds(**options: object) -> list[str]:
        docs = all_manifests(SchedulerOptions(extender_url=URL, sharing=True, **options))  # type: ignore[arg-type]
        return [f"{d['apiVersion']} {d['kind']}" for d in docs if "MutatingAdmission" in d["kind"]]

    assert kinds() == []
    api = MUTATING_APIS[-1]
    assert kinds(mutating_policy=api) == [f"{api} MutatingAdmissionPolicy", f"{api} MutatingAdmissionPolicyBinding"]
    assert kinds(mutating_policy=api, reservation_image="none") == []  # no UUID to give without reservation pods
    with pytest.raises(ConfigError, match="mutating_policy: expected one of"):
        SchedulerOptions(extender_url=URL, sharing=True, mutating_policy="v2").validated()
    with pytest.raises(ValueError, match="mutating policy API"):
        share_env_mutation("admissionregistration.k8s.io/v2")


def test_the_cli_writes_the_mutating_policy_in_the_version_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scheduler-config", "--url", URL, "--sharing", "--mutating-policy", "v1alpha1"]) == 0
    text = capsys.readouterr().out
    assert "apiVersion: admissionregistration.k8s.io/v1alpha1\nkind: MutatingAdmissionPolicy\n" in text
    # Its patches name every variable the share reads (its size: the GPU is a CDI device), each from its annotation.
    assert "# SHARE_DEVICE=cdi: a share's GPU reaches its containers as the CDI device" in text  # what nodes need
    policy = text.split("kind: MutatingAdmissionPolicy\n", 1)[1].split("---", 1)[0]
    for env in SHARE_ENV[1:]:
        assert f'"{env.name}"' in policy and env.annotation in policy
    assert "NVIDIA_VISIBLE_DEVICES" not in policy
    assert (
        main(["scheduler-config", "--url", URL, "--sharing", "--mutating-policy", "v1", "--share-device", "env"]) == 0
    )
    captured = capsys.readouterr()
    policy = captured.out.split("kind: MutatingAdmissionPolicy\n", 1)[1].split("---", 1)[0]
    assert '"NVIDIA_VISIBLE_DEVICES"' in policy and "any pod on a GPU node" in captured.err
    assert "# WARNING: SHARE_DEVICE=env" in captured.out
