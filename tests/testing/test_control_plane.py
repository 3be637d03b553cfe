"""Where the harness finds the control plane, and what it reads from the binaries' version: stand-in
binaries (scripts that print a version) in temporary folders, so these run on every machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.kube_binaries import BINARIES, KubeBinaries, find_binaries, machine_folder, missing


def fake_binaries(folder: Path, version: str, *, only: tuple[str, ...] = BINARIES, **versions: str) -> Path:
    """Scripts named like the three binaries that print ``Kubernetes VERSION`` for ``--version``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in only:
        script = folder / name
        script.write_text(f"#!/bin/sh\necho Kubernetes {versions.get(name.replace('-', '_'), version)}\n")
        script.chmod(0o755)
    return folder


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty machine: no $KUBE_BIN_DIR, a cache folder of its own."""
    monkeypatch.delenv("KUBE_BIN_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return machine_folder()


@pytest.mark.parametrize(
    ("version", "api", "dra"),
    [
        ("v1.33.3", "kubescheduler.config.k8s.io/v1", "resource.k8s.io/v1beta2"),
        ("v1.35.0", "kubescheduler.config.k8s.io/v1", "resource.k8s.io/v1"),
        ("v1.25.0", "kubescheduler.config.k8s.io/v1", None),
        ("v1.25.0-alpha.2", "kubescheduler.config.k8s.io/v1beta3", None),
        ("v0.0.0-master+89aaf7c02dd33415ac994cecfddca7c02ed75834", "kubescheduler.config.k8s.io/v1beta3", None),
        ("v1.24.17", "kubescheduler.config.k8s.io/v1beta3", None),
    ],
    ids=[
        "1.33 takes v1 and serves DRA v1beta2 behind its gate",
        "1.35 serves DRA v1 by default",
        "1.25.0 is the first to take v1",
        "the 1.25 pre-release takes v1beta3",
        "an unstamped build of the captures' commit takes v1beta3",
        "1.24 takes v1beta3",
    ],
)
def test_the_version_decides_the_scheduler_config_api_and_dra(version: str, api: str, dra: str | None) -> None:
    binaries = KubeBinaries(Path("/nowhere"), version)
    assert binaries.scheduler_api == api
    assert (binaries.dra[0] if binaries.dra else None) == dra


def test_dra_gate_goes_to_the_apiserver_and_the_scheduler_on_1_33_only() -> None:
    gated = KubeBinaries(Path("/nowhere"), "v1.33.3")
    assert gated.dra is not None
    assert "--feature-gates=DRAPrioritizedList=true,DynamicResourceAllocation=true" in gated.dra[1]
    assert gated.scheduler_gates["DRAPrioritizedList"] and gated.scheduler_gates["DynamicResourceAllocation"]
    assert any("resource.k8s.io/v1beta2=true" in flag for flag in gated.dra[1])
    assert KubeBinaries(Path("/nowhere"), "v1.34.1").dra == ("resource.k8s.io/v1", (), {})


@pytest.mark.parametrize(
    ("version", "gates"),
    [
        ("v1.33.3", {"DynamicResourceAllocation": True, "DRAPrioritizedList": True, "SchedulerAsyncPreemption": False}),
        ("v1.34.1", {}),
        ("v0.0.0-master+89aaf7c02dd33415ac994cecfddca7c02ed75834", {}),
    ],
    ids=["1.33: DRA on, and the product's synchronous preemption", "1.34: none", "the captures' build: none"],
)
def test_the_scheduler_runs_with_the_products_gates_for_its_version(version: str, gates: dict[str, bool]) -> None:
    assert KubeBinaries(Path("/nowhere"), version).scheduler_gates == gates


def test_the_machine_folder_is_found_without_kube_bin_dir_and_its_newest_version_wins(machine: Path) -> None:
    fake_binaries(machine / "v1.25.0-alpha.2", "v1.25.0-alpha.2")
    fake_binaries(machine / "v1.33.3", "v1.33.3")
    fake_binaries(machine / "v1.33.0-rc.1", "v1.33.0-rc.1")
    fake_binaries(machine / "broken", "v1.40.0", only=("kube-apiserver",))
    found = find_binaries()
    assert isinstance(found, KubeBinaries)
    assert (found.folder, found.version) == (machine / "v1.33.3", "v1.33.3")


def test_kube_bin_dir_wins_over_the_machine_folder(machine: Path, tmp_path: Path, monkeypatch) -> None:
    fake_binaries(machine, "v1.33.3")
    monkeypatch.setenv("KUBE_BIN_DIR", str(fake_binaries(tmp_path / "old", "v1.25.0-alpha.2")))
    found = find_binaries()
    assert isinstance(found, KubeBinaries)
    assert found.version == "v1.25.0-alpha.2"


def test_without_binaries_the_reason_is_one_line_that_names_kube_bin_dir(machine: Path) -> None:
    reason = missing()
    assert reason.startswith("no Kubernetes control plane: $KUBE_BIN_DIR is unset")
    assert str(machine) in reason
    assert "\n" not in reason


def test_an_incomplete_kube_bin_dir_is_named_with_what_it_lacks(machine: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KUBE_BIN_DIR", str(fake_binaries(tmp_path / "half", "v1.33.3", only=("kube-apiserver",))))
    reason = missing()
    assert reason.startswith("$KUBE_BIN_DIR: ")
    assert "kube-scheduler, kube-controller-manager" in reason


def test_binaries_of_different_versions_are_refused(machine: Path, tmp_path: Path, monkeypatch) -> None:
    folder = fake_binaries(tmp_path / "mixed", "v1.33.3", kube_scheduler="v1.32.0")
    monkeypatch.setenv("KUBE_BIN_DIR", str(folder))
    assert "different versions" in missing()


def test_a_binary_that_prints_no_version_is_refused(machine: Path, tmp_path: Path, monkeypatch) -> None:
    folder = fake_binaries(tmp_path / "odd", "v1.33.3")
    (folder / "kube-scheduler").write_text("#!/bin/sh\necho hello\n")
    monkeypatch.setenv("KUBE_BIN_DIR", str(folder))
    assert "printed 'hello'" in missing()


def test_a_process_whose_port_was_taken_meanwhile_starts_again_on_another(tmp_path: Path, monkeypatch) -> None:
    """The replay e2e test once failed with kube-apiserver's "bind: address already in use": the port probed
    free was taken before the server bound it. The first port handed out here is held by this test."""
    import socket
    import sys

    from testing import control_plane
    from testing.processes import free_port

    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: no bind may take it, no connection reaches it
    ports = iter([held.getsockname()[1], free_port()])
    monkeypatch.setattr(control_plane, "free_port", lambda: next(ports))
    serve = (
        "import socket, sys, time\n"
        "s = socket.socket()\n"
        "try:\n    s.bind(('127.0.0.1', int(sys.argv[1])))\n"
        "except OSError:\n    print('listen tcp: bind: address already in use'); sys.exit(1)\n"
        "s.listen(); time.sleep(30)\n"
    )

    def ready(port: int) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    plane = control_plane.ControlPlane(tmp_path)
    try:
        port = plane._listening("probe", lambda p: [sys.executable, "-c", serve, str(p)], ready, timeout_s=20)
        assert port != held.getsockname()[1]
        assert "address already in use" in (tmp_path / "probe.log").read_text()
    finally:
        plane.stop()
        held.close()
