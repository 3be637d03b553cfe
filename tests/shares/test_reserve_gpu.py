"""The GPU reservation program: NVML through ctypes, the device plugin's record, the report on its own pod.

NVML is a stand-in library (``fake_nvml.c``, built here with the C compiler) with NVML's ABI for the
calls the program makes, reporting what a real H200 reports (``../shared/fixtures/gpu/h200/nvml.json``);
``fixtures/reserve_gpu_h200.json`` is the program's own ``--discover`` output on a real H200.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shares import reserve_gpu
from shares.reserve_gpu import Nvml, ReservationError, plugin_uuids, report, reserved_gpu
from testing.kube_double import KubeApiDouble
from tests.conftest import make_pod

pytestmark = pytest.mark.server  # the API server double

HERE = Path(__file__).parent
H200 = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "gpu" / "h200" / "nvml.json"
ON_H200 = json.loads((HERE / "fixtures" / "reserve_gpu_h200.json").read_text())
SMI = "reserve_gpu_h200_nvidia_smi.csv"


@pytest.fixture(scope="module")
def h200() -> dict[str, Any]:
    if not H200.is_file():
        pytest.skip(f"{H200} is absent: the H200 fixtures come with ../shared")
    found: dict[str, Any] = json.loads(H200.read_text())
    return found


@pytest.fixture(scope="module")
def fake_nvml(h200: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``libnvidia-ml`` stand-in reporting the H200's first GPU and driver."""
    gpu = h200["gpus"][0]
    library = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    defines = {
        "FAKE_UUID": json.dumps(gpu["uuid"]),
        "FAKE_NAME": json.dumps(gpu["name"]),
        "FAKE_DRIVER": json.dumps(h200["driver"]),
        "FAKE_MEMORY": f"{gpu['memory_total_bytes']}ULL",
    }
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "no C compiler: tools/system-packages.sh installs gcc"
    command = [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(HERE / "fake_nvml.c")]
    subprocess.run(command + [f"-D{name}={value}" for name, value in defines.items()], check=True)
    return library


def test_nvml_through_ctypes_reads_the_gpu_as_a_real_h200_reports_it(fake_nvml: Path, h200: dict[str, Any]) -> None:
    found = Nvml.load(str(fake_nvml)).gpus()
    gpu = h200["gpus"][0]
    assert found == {
        "driver": h200["driver"],
        "gpus": [
            {"index": 0, "uuid": gpu["uuid"], "name": gpu["name"], "memory_total_bytes": gpu["memory_total_bytes"]}
        ],
    }


def test_on_a_real_h200_the_program_found_the_gpu_nvidia_smi_reports(h200: dict[str, Any]) -> None:
    """The program's ``--discover`` on a real H200 (the device machine, 2026-12-04), against
    ``nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version`` on the same machine, and the
    memory and driver the shared H200 fixture reports."""
    index, uuid, name, memory_mib, driver = next(csv.reader((HERE / "fixtures" / SMI).open(), skipinitialspace=True))
    assert ON_H200["gpus"] == [
        {"index": int(index), "uuid": uuid, "name": name, "memory_total_bytes": h200["gpus"][0]["memory_total_bytes"]}
    ]
    assert ON_H200["driver"] == driver == h200["driver"]
    assert int(memory_mib) == ON_H200["gpus"][0]["memory_total_bytes"] // 2**20  # nvidia-smi counts MiB
    # NVIDIA_VISIBLE_DEVICES held an index there (no device plugin): no record to check NVML against.
    assert ON_H200["device_plugin"] is None


def test_several_gpus_are_refused(fake_nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_COUNT", "2")
    found = Nvml.load(str(fake_nvml)).gpus()
    assert len({gpu["uuid"] for gpu in found["gpus"]}) == 2
    with pytest.raises(ReservationError, match="expected exactly one GPU in this container, NVML shows 2"):
        reserved_gpu(found, None)


def test_an_nvml_error_is_named(fake_nvml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_INIT", "9")
    with pytest.raises(ReservationError, match=r"nvmlInit_v2: NVML error 9 \(Driver Not Loaded\)"):
        Nvml.load(str(fake_nvml)).gpus()


def test_no_nvml_in_the_container_is_named() -> None:
    with pytest.raises(
        ReservationError, match=r"cannot load libnvidia-ml-absent\.so\.1: .*was this container given a GPU"
    ):
        Nvml.load("libnvidia-ml-absent.so.1")


def test_the_device_plugins_record_is_read_from_either_strategy(tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "GPU-1111").touch()
    assert plugin_uuids({"NVIDIA_VISIBLE_DEVICES": "GPU-2222"}, devices) == ["GPU-1111"]  # volume-mounts first
    assert plugin_uuids({"NVIDIA_VISIBLE_DEVICES": "GPU-2222"}, tmp_path / "none") == ["GPU-2222"]
    for unnamed in ("all", "void", "0", "", "nvidia.com/gpu=0"):
        assert plugin_uuids({"NVIDIA_VISIBLE_DEVICES": unnamed}, tmp_path / "none") is None


def test_nvml_and_the_device_plugin_disagreeing_is_refused(fake_nvml: Path, h200: dict[str, Any]) -> None:
    found = Nvml.load(str(fake_nvml)).gpus()
    assert reserved_gpu(found, [h200["gpus"][0]["uuid"]]) == h200["gpus"][0]["uuid"]
    with pytest.raises(ReservationError, match="the device plugin allocated GPU-other: refusing to report either"):
        reserved_gpu(found, ["GPU-other"])


def _account(tmp_path: Path, token: str) -> Path:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token + "\n")
    return account


def test_the_report_patches_only_its_own_pods_annotation_with_its_own_token(tmp_path: Path) -> None:
    pod = make_pod("reserve-gpu-0", 1, node_name="gpu-node-0", phase="Running")
    with KubeApiDouble(tokens=["reservation-token"]) as api:
        api.load("pods", [pod])
        base = api.start()

        def over_http(request: urllib.request.Request) -> Any:  # the double speaks HTTP, the pod HTTPS
            request.full_url = request.full_url.replace("https://kubernetes.default.svc:443", base)
            return urllib.request.urlopen(request, timeout=5)

        environ = {
            "POD_NAMESPACE": "default",
            "POD_NAME": "reserve-gpu-0",
            "KUBERNETES_SERVICE_HOST": "kubernetes.default.svc",
        }
        report("GPU-f4ece6de-2ed3-261b-742e-c0d1f016a17d", environ, _account(tmp_path, "reservation-token"), over_http)
        stored = api.get("pods", "reserve-gpu-0", "default")
        stored_uuid = "GPU-f4ece6de-2ed3-261b-742e-c0d1f016a17d"
        assert stored["metadata"]["annotations"][reserve_gpu.RESERVED_GPU_ANNOTATION] == stored_uuid
        annotations = {**pod["metadata"].get("annotations", {}), reserve_gpu.RESERVED_GPU_ANNOTATION: stored_uuid}
        assert stored["spec"] == pod["spec"] and stored["metadata"].get("annotations") == annotations
        # A token the API server does not accept, or a pod that is not there: named, nothing written.
        (tmp_path / "serviceaccount" / "token").write_text("stolen")
        with pytest.raises(ReservationError, match="reporting GPU-x on default/reserve-gpu-0: HTTP Error 401"):
            report("GPU-x", environ, tmp_path / "serviceaccount", over_http)
        assert stored == api.get("pods", "reserve-gpu-0", "default")


def test_a_pod_without_its_name_reports_nothing(tmp_path: Path) -> None:
    with pytest.raises(ReservationError, match="POD_NAME, KUBERNETES_SERVICE_HOST unset"):
        report("GPU-x", {"POD_NAMESPACE": "default"}, _account(tmp_path, "t"))


def test_the_program_is_the_standard_library_alone() -> None:
    """It runs from a stock Python image, shipped as a ConfigMap: nothing but the standard library."""
    source = Path(reserve_gpu.__file__).read_text()
    code = f"exec(compile({source!r}, 'reserve_gpu.py', 'exec'), {{'__name__': 'x'}})"
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
