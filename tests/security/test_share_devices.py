"""A share's GPU reaches its containers through a channel no tenant can write (issue "Safe to deploy, third
pass"): the bind names the GPU's CDI device in the Binding, a value of one shape each; only the bind may
write any CDI device annotation, in the pod or in a Binding; and a reservation pod's report is believed only
when it is a GPU UUID. ``tests/e2e/test_reserved_shares.py`` sends the same through a real 1.33 API server."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from manifests.access import DEFAULT_SCHEDULER_ACCOUNT, EXTENDER, TRUSTED_NAMESPACE_LABEL
from manifests.share_env import container_gpus
from scheduler_core.k8s.names import (
    CDI_DEVICE_ANNOTATION,
    CDI_DEVICE_KIND,
    RESERVED_GPU_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
)
from testing.kube_double import KubeApiDouble
from testing.reservation_kubelet import gpu_uuid
from tests.manifests.test_admission_cel import POD, WRITTEN, annotation_writes, changed, denials
from tests.shares.conftest import RESERVED, pending, pod_on, reserving_binder
from tests.shares.conftest import api as api  # the fixtures
from tests.shares.conftest import ledger as ledger

pytestmark = pytest.mark.server  # the API server double

TENANT = {"user": "tenant", "groups": ["system:authenticated"]}
DEVICE_KEYS = (CDI_DEVICE_ANNOTATION, "nvidia.cdi.k8s.io/container.main", "cdi.k8s.io/anything")


@pytest.mark.parametrize("device", ["cdi", "env"])
def test_a_shares_containers_get_exactly_its_gpu_by_the_channel_set(
    api: KubeApiDouble, ledger: LedgerStore, device: str
) -> None:
    """``cdi``: the Binding names the GPU's CDI device (the device plugin's kind, by UUID), which every
    container gets; ``env``: no CDI device, and each container's ``NVIDIA_VISIBLE_DEVICES`` names it."""
    from manifests.share_env import share_env

    binder = reserving_binder(api, ledger)
    binder.share_device = device
    pod = api.get("pods", pending(api, "a", milli=300).pod_name, "default")
    pod["spec"]["containers"][0]["env"] = share_env(device)
    api.load("pods", [pod])
    assert binder.bind(pending_of(pod)).error == ""
    bound = api.get("pods", "a", "default")
    annotations = bound["metadata"]["annotations"]
    uuid = gpu_uuid("t4-0", 0)
    assert annotations[VISIBLE_DEVICES_ANNOTATION] == uuid
    if device == "cdi":
        assert annotations[CDI_DEVICE_ANNOTATION] == f"{CDI_DEVICE_KIND}={uuid}"
    else:
        assert CDI_DEVICE_ANNOTATION not in annotations
    assert container_gpus(bound, bound["spec"]["containers"][0], device) == (uuid,)


def pending_of(pod: dict[str, Any]) -> Any:
    from scheduler_core.extender.wire import ExtenderBindingArgs

    return ExtenderBindingArgs(pod["metadata"]["name"], "default", pod["metadata"]["uid"], "t4-0")


@pytest.mark.parametrize("reported", ["all", "0,1,2,3", "GPU-1", "GPU-8A1B2C3D-0000-1111-2222-333344445555"])
def test_a_reservation_pod_that_reports_anything_but_a_gpu_uuid_gives_no_share_a_gpu(
    api: KubeApiDouble, ledger: LedgerStore, reported: str
) -> None:
    """A reservation pod made (or patched) to say ``all`` would have given its shares every GPU of the node
    (``visible-devices: all``). Now the bind refuses, writes no Binding, and rolls the ledger back."""
    api.reservations_report = False
    binder = reserving_binder(api, ledger)
    binder.uuid_wait_s = 0.2
    first = binder.bind(pending(api, "a", milli=250))  # creates the reservation pod; nothing reported yet
    assert first.error_kind in ("reservation_pending", "")
    name = "gpu-reservation-t4-0-0"
    pod = api.get("pods", name, RESERVED)
    pod["metadata"]["annotations"][RESERVED_GPU_ANNOTATION] = reported
    api.load("pods", [{**pod, "status": {"phase": "Running"}}])
    outcome = binder.bind(pending(api, "b", milli=250))
    assert outcome.error_kind == "reservation_pending" and outcome.rolled_back
    assert "which is not a GPU UUID; no share is bound to it" in outcome.error
    assert pod_on(api, "b") == (None, None)
    assert "b" not in str(ledger.read("t4-0", 4).assignments)


@pytest.mark.parametrize("key", DEVICE_KEYS)
@pytest.mark.parametrize(("resource", "operation", "new", "was"), annotation_writes(but=("removed",)))
def test_no_tenant_may_give_a_pod_a_cdi_device(key: str, resource: str, operation: str, new: Any, was: Any) -> None:
    value = f"{CDI_DEVICE_KIND}=GPU-8a1b2c3d-0000-1111-2222-333344445555"

    def pod(present: Any) -> Any:
        if present is None:
            return None
        if present is False:
            return POD
        return changed(POD, ("metadata", "annotations", key), present if isinstance(present, str) else value)

    obj = {"metadata": {"annotations": {key: value}}} if resource == "pods/binding" else pod(new)
    request = {"resource": resource, "operation": operation, "obj": obj, "old": pod(was)}
    found = denials(**request, **TENANT)
    assert found and all("only the gpu-scheduler extender may" in message for message in found), found
    # An administrator's namespace (kube-system, or labelled trusted) keeps its own CDI annotations, but not
    # the bind's own key.
    trusted = denials(**request, **TENANT, namespace_labels={TRUSTED_NAMESPACE_LABEL: "trusted"})
    assert (trusted == []) is (key != CDI_DEVICE_ANNOTATION), trusted


def test_a_tenant_keeps_its_other_annotations_and_the_bind_its_device() -> None:
    mine = changed(POD, ("metadata", "annotations", "example.com/cdi.k8s.io"), "not a device request")
    assert denials(resource="pods", operation="CREATE", obj=mine, **TENANT) == []
    binding = {"metadata": {"annotations": {CDI_DEVICE_ANNOTATION: WRITTEN[CDI_DEVICE_ANNOTATION]}}}
    for user, groups in (("e", [EXTENDER.group]), (DEFAULT_SCHEDULER_ACCOUNT, [])):
        assert denials(resource="pods/binding", operation="CREATE", user=user, groups=groups, obj=binding) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (VISIBLE_DEVICES_ANNOTATION, "all"),
        (CDI_DEVICE_ANNOTATION, "nvidia.com/gpu=all"),
        (CDI_DEVICE_ANNOTATION, f"{CDI_DEVICE_KIND}=GPU-8a1b2c3d-0000-1111-2222-333344445555,{CDI_DEVICE_KIND}=1"),
        ("gpu-scheduler.io/assigned-gpus", "0:250;rm -rf"),
        ("gpu-scheduler.io/gpu-portion", "1.0"),
        ("gpu-scheduler.io/mps-thread-percentage", "100%"),
        ("gpu-scheduler.io/mps-memory-limit", "0=80G"),
    ],
)
def test_a_binders_binding_with_a_value_off_the_binds_shape_is_refused(key: str, value: str) -> None:
    """Values are checked where they are written: a stolen binder credential cannot point a share at every
    GPU (``all``) through a Binding it may post."""
    binding = {"metadata": {"annotations": {**WRITTEN, key: value}}}
    for user, groups in (("e", [EXTENDER.group]), (DEFAULT_SCHEDULER_ACCOUNT, [])):
        found = denials(resource="pods/binding", operation="CREATE", user=user, groups=groups, obj=binding)
        assert any("must be of the bind's shapes" in message for message in found), found


def test_container_gpus_reads_only_the_channel_the_runtime_honours() -> None:
    """With ``cdi`` a container's ``NVIDIA_VISIBLE_DEVICES`` names nothing (the toolkit ignores it from
    unprivileged containers); with ``env`` a CDI annotation names nothing (the runtime reads none)."""
    uuid = "GPU-8a1b2c3d-0000-1111-2222-333344445555"
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"] = {CDI_DEVICE_ANNOTATION: f"{CDI_DEVICE_KIND}={uuid}"}
    container = {"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    assert container_gpus(pod, container, "cdi") == (uuid,)
    assert container_gpus(pod, container, "env") == ("all",)


@pytest.mark.parametrize("device", ["cdi", "env"])
def test_the_extender_warns_at_start_where_shares_get_their_gpu_by_the_variable(
    aws_session: Any, caplog: pytest.LogCaptureFixture, device: str
) -> None:
    """``SHARE_DEVICE=env`` is kept as an option, and ``serve`` and the Lambda (one ``build``) say at start what
    it exposes; ``cdi`` says nothing."""
    import logging

    from application.extender.service import build
    from application.extender.settings import ExtenderSettings

    settings = ExtenderSettings(ledger_table="ledger", kube_api_url="https://127.0.0.1:1", kube_token="t",
                                share_device=device)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        build(settings, logger=logging.getLogger("test-extender"), session=aws_session)
    warned = [r.getMessage() for r in caplog.records if "SHARE_DEVICE=env" in r.getMessage()]
    assert (len(warned) == 1 and "sees every GPU it names" in warned[0]) is (device == "env"), warned
