import numpy as np
import pytest

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.names import LABEL_MEMORY, LABEL_MODEL
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pod_requests import effective_cpu_milli, effective_gpu_request, requests_with_cpu
from scheduler_core.k8s.pods import MAX_MEMORY_CHARS, MAX_MODELS_CHARS, parse_models, pod_demand
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
        pytest.param("١٢", "expected a Kubernetes quantity", id="Arabic-Indic digits, which Decimal reads as 12"),
        pytest.param("." + "0" * 5000 + "1", "out of range: at most 64 characters", id="5,000 decimals"),
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
        pytest.param({"gpu.nvidia.com/memory": "-1"}, "must not be negative, got '-1'", id="negative MiB"),
        pytest.param({"gpu.nvidia.com/memory": "9" * 19}, "'9{19}' is out of range", id="19 digits of MiB"),
        pytest.param({"gpu.nvidia.com/memory": "١٢Gi"}, "expected MiB .* got '١٢Gi'", id="Arabic-Indic digits"),
        pytest.param({"gpu.nvidia.com/memory": "١٢"}, "expected MiB .* got '١٢'", id="Arabic-Indic MiB"),
    ],
)
def test_garbage_annotations_are_pod_errors_naming_annotation_and_value(annotations, message):
    pod = make_pod("p", 1)
    pod["metadata"]["annotations"] = annotations
    with pytest.raises(InvalidPodError, match=message):
        pod_demand(pod)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        pytest.param({LABEL_MODEL: "x" * 1_000_000}, f"1000000 characters; at most {MAX_MODELS_CHARS}", id="models"),
        pytest.param({LABEL_MODEL: "A100," * 300}, "1500 characters", id="300 models"),
        pytest.param({LABEL_MEMORY: "9" * 5000}, f"5000 characters; at most {MAX_MEMORY_CHARS}", id="memory digits"),
        pytest.param({LABEL_MEMORY: "0." + "0" * 10_000 + "1Ei"}, "10005 characters", id="memory decimals"),
        pytest.param({LABEL_MEMORY: "40Gi" + " " * 100}, "104 characters", id="memory padded with spaces"),
    ],
)
def test_annotations_past_their_length_are_refused_without_echoing_them(annotations, message):
    pod = make_pod("p", 1)
    pod["metadata"]["annotations"] = annotations
    with pytest.raises(InvalidPodError) as raised:
        pod_demand(pod)
    error = str(raised.value)
    assert error.startswith(f"annotation {next(iter(annotations))}: ") and message in error
    assert len(error) < 200


def test_a_bad_model_in_a_long_list_is_quoted_cut():
    value = "A100," * 200 + "A1@0"
    with pytest.raises(
        InvalidPodError, match=r"'A1@0' is not a GPU model name \(in 'A100,A100.*\.\.\. \(1004 characters\)\)"
    ):
        parse_models(value)


def test_a_bound_pod_with_a_million_digit_cpu_is_one_problem_not_a_failed_cluster_read():
    """Every pod of the cluster is read for the state; a million digits used to raise decimal.Overflow
    there, and no state was built at all."""
    table = NodeTable.from_nodes(make_nodes("A100"))
    hostile = make_pod("hostile", 1, node_name="a100-0", phase="Running")
    hostile["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4" * 1_000_000
    (gpus,), cpu, problem = requests_with_cpu(hostile["spec"], ("nvidia.com/gpu",))
    assert (gpus, cpu) == (1, 0) and problem.startswith("containers[0].resources.requests.cpu: '444")
    assert "(1000000 characters) is out of range" in problem and len(problem) < 200
    usage = gpu_usage(table, [hostile, make_pod("ok", 2, node_name="a100-0", phase="Running")], 8)
    assert usage.whole_gpus.tolist() == [3] and len(usage.problems) == 1


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
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "4" * 1_000_000}}}]},
            r"containers\[0\].resources.requests.cpu: '4+\.\.\. \(1000000 characters\) is out of range",
            id="a million digits, which overflowed Decimal times 1000",
        ),
        pytest.param(
            {"containers": [], "overhead": {"cpu": "4" * 1_000_000}},
            r"spec.overhead.cpu: .* is out of range",
            id="a million digits of overhead",
        ),
        pytest.param(
            {"containers": [{"resources": {"limits": {"cpu": 10**5000}}}]},
            r"limits.cpu: an integer of 5001 digits is out of range",
            id="a 5,000-digit integer, whose repr raised ValueError",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "٢"}}}]},
            r"requests.cpu: expected a Kubernetes quantity",
            id="an Arabic-Indic digit",
        ),
    ],
)
def test_an_invalid_cpu_quantity_is_a_pod_error_naming_the_field(spec, message):
    with pytest.raises(InvalidPodError, match=message):
        effective_cpu_milli(spec)
