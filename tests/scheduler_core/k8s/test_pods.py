import numpy as np
import pytest

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import effective_cpu_milli, effective_gpu_request, pod_demand
from scheduler_core.state.allocation import gpu_usage
from tests.conftest import make_nodes, make_pod


def container(gpus=None, *, limits=None, requests=None, restart=None):
    resources = {}
    if gpus is not None:
        resources = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    c = {"name": "c", "resources": resources}
    if restart:
        c["restartPolicy"] = restart
    return c


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [container("2")]}, 2, id="one container"),
        pytest.param({"containers": [container("1"), container("1")]}, 2, id="containers add up"),
        pytest.param(
            {"containers": [container("1"), container("1")], "initContainers": [container("4")]},
            4,
            id="a larger init container wins over the sum",
        ),
        pytest.param(
            {"containers": [container("3")], "initContainers": [container("2")]},
            3,
            id="a smaller init container does not",
        ),
        pytest.param(
            {"containers": [container(limits={"nvidia.com/gpu": "2"})]}, 2, id="a limit without a request counts"
        ),
        pytest.param(
            {"containers": [container(requests={"nvidia.com/gpu": "1"})]}, 1, id="a request without a limit counts"
        ),
        pytest.param(
            {"containers": [container("1")], "initContainers": [container("1", restart="Always"), container("2")]},
            3,
            id="a sidecar init container runs beside later init containers",
        ),
        pytest.param(
            {"containers": [container("2")], "initContainers": [container("1", restart="Always")]},
            3,
            id="a sidecar adds to the app containers",
        ),
        pytest.param({"containers": [container()]}, 0, id="no GPU"),
        pytest.param({}, 0, id="no containers"),
    ],
)
def test_effective_request_follows_kube_scheduler(spec, expected):
    assert effective_gpu_request(spec) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("-1", "non-negative whole number, got '-1'", id="negative"),
        pytest.param("0.5", "non-negative whole number, got '0.5'", id="fractional"),
        pytest.param("two", "quantity", id="garbage"),
        pytest.param(["1"], "quantity string", id="wrong JSON type"),
    ],
)
def test_invalid_gpu_quantity_is_a_pod_error_naming_the_container(value, message):
    spec = {"containers": [container(limits={"nvidia.com/gpu": value})]}
    with pytest.raises(InvalidPodError, match=rf"containers\[0\]\.resources\.limits\.nvidia\.com/gpu: .*{message}"):
        effective_gpu_request(spec)


def test_annotations_give_models_and_memory():
    demand = pod_demand(make_pod("p", 2, models="a100, NVIDIA-H100-80GB-HBM3", memory="40Gi"))
    assert demand.gpus == 2
    assert demand.models == frozenset({"A100", "H100"})
    assert demand.min_memory_mib == 40960
    assert demand.key == "default/p"


@pytest.mark.parametrize(
    ("memory", "mib"),
    [
        pytest.param("40960", 40960, id="a plain integer is MiB"),
        pytest.param("40Gi", 40960, id="binary quantity"),
        pytest.param("40G", 38147, id="decimal quantity rounds up to whole MiB"),
        pytest.param("0", 0, id="zero means no constraint"),
    ],
)
def test_memory_annotation_units(memory, mib):
    assert pod_demand(make_pod("p", 1, memory=memory)).min_memory_mib == mib


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        pytest.param(
            {"gpu.nvidia.com/memory": "lots"}, "gpu.nvidia.com/memory: expected MiB .* got 'lots'", id="memory"
        ),
        pytest.param({"gpu.nvidia.com/memory": "-40Gi"}, "must not be negative, got '-40Gi'", id="negative memory"),
        pytest.param({"gpu.nvidia.com/model": "A100,,H100"}, "'' is not a GPU model name", id="empty model item"),
        pytest.param({"gpu.nvidia.com/model": "A1@0"}, "'A1@0' is not a GPU model name", id="bad model characters"),
        pytest.param({"gpu.nvidia.com/model": " "}, "expected a comma list", id="blank model"),
    ],
)
def test_garbage_annotations_are_pod_errors_naming_annotation_and_value(annotations, message):
    pod = make_pod("p", 1)
    pod["metadata"]["annotations"] = annotations
    with pytest.raises(InvalidPodError, match=message):
        pod_demand(pod)


def test_pods_using_gpus_are_counted_per_node_and_terminal_ones_are_not():
    table = NodeTable.from_nodes(make_nodes("A100", "T4"))
    pods = [
        make_pod("a", 2, node_name="a100-0", phase="Running"),
        make_pod("b", 3, node_name="a100-0", phase="Pending"),
        make_pod("done", 4, node_name="a100-0", phase="Succeeded"),
        make_pod("failed", 4, node_name="t4-1", phase="Failed"),
        make_pod("unbound", 8),
        make_pod("elsewhere", 1, node_name="not-in-table", phase="Running"),
        make_pod("t", 1, node_name="t4-1", phase="Running"),
    ]
    usage = gpu_usage(table, pods, 8)
    assert usage.whole_gpus.tolist() == [5, 1]
    assert usage.whole_gpus.dtype == np.int32
    assert usage.problems == ()


def test_invalid_bound_pod_is_reported_not_raised():
    table = NodeTable.from_nodes(make_nodes("A100"))
    bad = make_pod("bad", 1, node_name="a100-0", phase="Running")
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "x"
    usage = gpu_usage(table, [bad, "junk", make_pod("ok", 2, node_name="a100-0", phase="Running")], 8)
    used, problems = usage.whole_gpus, usage.problems
    assert used.tolist() == [2]
    assert len(problems) == 2
    assert "bad on a100-0" in problems[0]
    assert "pods[1]" in problems[1]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [{"resources": {"requests": {"cpu": "500m"}}}] * 2}, 1000, id="containers add up"),
        pytest.param({"containers": [{"resources": {"limits": {"cpu": "2"}}}]}, 2000, id="a limit alone counts"),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}}]}, 1000,
            id="the request wins over the limit",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
             "initContainers": [{"resources": {"requests": {"cpu": "3"}}}]}, 3000,
            id="a larger init container sets the request",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
             "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}}]}, 1250,
            id="a sidecar runs alongside",
        ),
        pytest.param({"containers": [{}], "overhead": {"cpu": "120m"}}, 120, id="overhead adds"),
        pytest.param({"containers": [{"resources": {"requests": {"cpu": "0.0001"}}}]}, 1, id="rounds up"),
        pytest.param({"containers": [{"resources": {"requests": {"cpu": 3}}}]}, 3000, id="a JSON number"),
    ],
)  # fmt: skip
def test_effective_cpu_follows_kube_scheduler(spec, expected):
    assert effective_cpu_milli(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}, r"containers\[0\].resources.requests.cpu"),
        ({"containers": [{"resources": {"limits": {"cpu": "-1"}}}]}, "must not be negative"),
        ({"containers": [], "overhead": {"cpu": "1x"}}, "spec.overhead.cpu"),
    ],
)
def test_an_invalid_cpu_quantity_is_a_pod_error_naming_the_field(spec, message):
    with pytest.raises(InvalidPodError, match=message):
        effective_cpu_milli(spec)
