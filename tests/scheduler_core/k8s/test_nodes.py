import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.hash_index import HashIndex
from scheduler_core.k8s.node_facts import gpu_facts
from scheduler_core.k8s.nodes import NodeTable
from tests.conftest import SCHEDULER_FIXTURES, load_fixture, make_nodes, requires_fixtures


def node(labels, allocatable=None, name="n"):
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable or {}}}


def test_gfd_labels_win_over_project_labels():
    facts = gpu_facts(
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.count": "8",
            "gpu.nvidia.com/model": "V100",
            "gpu.nvidia.com/memory": "16384",
            "gpu.nvidia.com/count": "4",
        },
        {"nvidia.com/gpu": "8"},
    )
    assert (facts.model, facts.memory_mib, facts.count, facts.allocatable) == ("A100", 81920, 8, 8)


def test_project_labels_are_used_without_gfd():
    facts = gpu_facts({"gpu.nvidia.com/model": "T4", "gpu.nvidia.com/memory": "15360"}, {"nvidia.com/gpu": "4"})
    assert (facts.model, facts.memory_mib, facts.error) == ("T4", 15360, "")


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        pytest.param({"gpu.nvidia.com/memory": "lots"}, "gpu.nvidia.com/memory='lots'", id="non-numeric memory"),
        pytest.param({"nvidia.com/gpu.memory": "-1"}, "nvidia.com/gpu.memory='-1'", id="negative GFD memory"),
        pytest.param({"nvidia.com/gpu.count": "9" * 12}, "nvidia.com/gpu.count", id="count beyond int32"),
        pytest.param({"nvidia.com/gpu.product": "???"}, "nvidia.com/gpu.product='???'", id="garbled product"),
    ],
)
def test_garbled_label_means_no_gpu_information_with_a_reason(labels, fragment):
    facts = gpu_facts({"gpu.nvidia.com/model": "A100", **labels}, {"nvidia.com/gpu": "8"})
    assert facts.model is None
    assert facts.memory_mib == 0
    assert fragment in facts.error
    assert facts.allocatable == 8, "allocatable GPUs come from the node status, not labels"


H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.count": "8"}


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        pytest.param({"nvidia.com/mig.config.state": "pending"}, "is being reconfigured", id="pending"),
        pytest.param({"nvidia.com/mig.config.state": "rebooting"}, "is being reconfigured", id="rebooting"),
        pytest.param({"nvidia.com/mig.config.state": "failed"}, "could not be reconfigured", id="failed"),
        pytest.param({"nvidia.com/gpu.product": "NVIDIA-H200-MIG-INVALID"}, "MIG layouts differ", id="invalid"),
    ],
)
def test_a_node_whose_mig_layout_is_unsettled_or_invalid_has_no_gpu_information(labels, fragment):
    """Its GPUs are not what its labels say: GPU pods are refused there, with the MIG manager's or GFD's
    word quoted (the filter's reason); what it allocates still counts."""
    facts = gpu_facts({**H200, **labels}, {"nvidia.com/gpu": "8"})
    assert (facts.model, facts.memory_mib, facts.allocatable) == (None, 0, 8)
    assert fragment in facts.error and next(iter(labels.values())) in facts.error


def test_a_settled_mig_layout_changes_nothing():
    plain = gpu_facts(H200, {"nvidia.com/gpu": "8"})
    assert gpu_facts({**H200, "nvidia.com/mig.config.state": "success"}, {"nvidia.com/gpu": "8"}) == plain
    assert plain.model == "H200" and plain.error == ""


def test_garbled_allocatable_counts_as_zero_with_a_reason():
    facts = gpu_facts({"gpu.nvidia.com/model": "A100"}, {"nvidia.com/gpu": "eight"})
    assert facts.allocatable == 0
    assert facts.model == "A100"
    assert "allocatable nvidia.com/gpu" in facts.error


def test_table_is_columnar_and_interns_vocabularies():
    table = NodeTable.from_nodes(make_nodes("A100", "T4", "A100"))
    assert table.names == ("a100-0", "t4-1", "a100-2")
    assert table.model_id.dtype == np.int32
    assert [table.model_name(i) for i in range(3)] == ["A100", "T4", "A100"]
    assert table.alloc_gpus.tolist() == [8, 4, 8]
    assert table.memory_mib.tolist() == [40960, 15360, 40960]
    assert [table.zone_name(i) for i in range(3)] == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert table.models == ("A100", "T4")


def test_table_records_label_errors_without_raising():
    table = NodeTable.from_nodes([node({"gpu.nvidia.com/memory": "x"}, {"nvidia.com/gpu": "4"}), node({}, name="m")])
    assert table.gpu_info_errors.keys() == {0}
    assert table.gpu_info_error_mask.tolist() == [True, False]
    assert table.model_id.tolist() == [-1, -1]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        pytest.param("gpu-node-0", r"Nodes.items\[0\]: expected a v1 Node object", id="a string is not a node"),
        pytest.param({"metadata": {}}, r"Nodes.items\[0\]: metadata.name is missing", id="a node needs a name"),
        pytest.param({"metadata": None}, "metadata.name is missing", id="null metadata"),
    ],
)
def test_malformed_node_objects_are_invalid_args(item, message):
    with pytest.raises(InvalidArgsError, match=message):
        NodeTable.from_nodes([item])


def test_take_selects_rows_and_keeps_label_errors_aligned():
    table = NodeTable.from_nodes(
        [node({}, name="a"), node({"gpu.nvidia.com/count": "x"}, name="b"), node({}, name="c")]
    )
    sub = table.take([2, 1])
    assert sub.names == ("c", "b")
    assert dict(sub.gpu_info_errors).keys() == {1}


def test_columns_must_match_the_number_of_names():
    table = NodeTable.from_nodes(make_nodes("A100"))
    with pytest.raises(ValueError, match=r"NodeTable.zone_id: expected shape \(2,\), got \(1,\)"):
        NodeTable(**{**table.__dict__, "names": ("x", "y")})


@requires_fixtures()
def test_real_captured_nodes_read_as_the_fixture_readme_describes():
    request = load_fixture(
        SCHEDULER_FIXTURES / "01-filter-prioritize-nodecache-false" / "01-filter-gpu-a100-2.request.json"
    )
    table = NodeTable.from_nodes(request["Nodes"]["items"])
    assert table.names == ("gpu-node-0", "gpu-node-1", "gpu-node-2")
    assert [table.model_name(i) for i in range(3)] == ["A100", "V100", "T4"]
    assert table.alloc_gpus.tolist() == [8, 4, 4]
    assert [table.instance_types[i] for i in table.instance_type_id] == ["p4d.24xlarge", "p3.8xlarge", "g4dn.12xlarge"]
    assert not table.gpu_info_errors


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=12), unique=True, max_size=60),
    st.lists(st.text(min_size=1, max_size=12), max_size=30),
)
def test_rows_of_agrees_with_the_name_index(names, extra):
    table = NodeTable.from_columns(alloc_gpus=[1] * len(names), names=names)
    queries = names[::2] + extra
    assert table.rows_of(queries).tolist() == [table.index.get(q, -1) for q in queries]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, 1, 2**40, -(2**40)]), max_size=300),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20),
    st.integers(0, 5),
)
def test_the_hash_index_finds_each_keys_first_row(keys, others, crowd):
    """Keys that repeat, the key 0 (an empty slot's), and keys crowded into one bucket past its eight
    slots (``crowd``: multiples of a large power of two share their low bits) are all found, at the
    first row that has them; keys absent are -1."""
    keys = keys + [k << 20 for k in range(crowd * 4)]
    index = HashIndex.build(np.array(keys, dtype=np.int64))
    first: dict[int, int] = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    wanted = keys + others
    assert index.find(np.array(wanted, dtype=np.int64)).tolist() == [first.get(k, -1) for k in wanted]
