import pytest

from scheduler_core.k8s.gpu_models import normalize_model


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        pytest.param("NVIDIA-A100-SXM4-40GB", "A100", id="GFD A100 product name"),
        pytest.param("NVIDIA-A100-SXM4-80GB", "A100", id="memory variant maps to the same family"),
        pytest.param("NVIDIA-H100-80GB-HBM3", "H100", id="GFD H100 product name"),
        pytest.param("Tesla-V100-SXM2-16GB", "V100", id="Tesla prefix is dropped"),
        pytest.param("Tesla-T4", "T4", id="Tesla T4"),
        pytest.param("NVIDIA-A10G", "A10G", id="A10G keeps its suffix letter"),
        pytest.param("NVIDIA-L40S", "L40S", id="L40S"),
        pytest.param("NVIDIA-A100-SXM4-40GB-SHARED", "A100", id="time-slicing SHARED suffix is dropped"),
        pytest.param("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100", id="MIG profile suffix is dropped"),
        pytest.param("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED", "H100", id="MIG and SHARED together"),
        pytest.param("a100", "A100", id="short names are case-insensitive"),
        pytest.param(" H200 ", "H200", id="surrounding spaces are ignored"),
        pytest.param("NVIDIA-RTX-A6000", "RTXA6000", id="series word joins the model"),
    ],
)
def test_product_names_map_to_short_family_names(raw, short):
    assert normalize_model(raw) == short


@pytest.mark.parametrize("raw", ["", "   ", "A100!", "NVIDIA", "-A100", "x" * 70])
def test_unusable_model_names_give_none(raw):
    assert normalize_model(raw) is None
