"""The GPU reservation program: which GPU the device plugin gave this container, reported on its own pod.

A reservation pod requests ``nvidia.com/gpu: 1`` on a node where shares of one GPU are placed, so that
the stock NVIDIA device plugin picks a physical GPU for it and Kubernetes counts that GPU as taken. This
program runs in that pod, from a stock Python image (the standard library only: it is shipped as a
ConfigMap), and:

1. **discovers** the GPU it was given, through NVML (``libnvidia-ml.so.1``, which the NVIDIA container
   toolkit mounts into a container given a GPU with the ``utility`` capability), called with ctypes; the
   device plugin's own record of the allocation is checked against it where the container has one
   (``NVIDIA_VISIBLE_DEVICES`` holding UUIDs, the envvar strategy, or the file names under
   ``/var/run/nvidia-container-devices``, the volume-mounts strategy);
2. **reports** that GPU's UUID in its own pod's annotation ``gpu-scheduler.io/reserved-gpu`` (a JSON
   merge patch, with the pod's own service-account token: the identity may change only its pod);
3. **holds** the GPU, asleep, until SIGTERM.

It refuses to report a GPU it cannot vouch for: none or several visible, or NVML and the device
plugin's record naming different GPUs (a MIG device among them: NVML here names whole GPUs, and
reservations are for whole GPUs). ``--discover`` prints what it found as JSON and exits
(``tests/shares/fixtures/reserve_gpu_h200.json`` is that output on a real H200).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import ssl
import sys
import urllib.request
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

RESERVED_GPU_ANNOTATION = "gpu-scheduler.io/reserved-gpu"  # scheduler_core.k8s.names; the program stands alone
DEVICE_LIST_DIR = Path("/var/run/nvidia-container-devices")
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NVML_LIBRARY = "libnvidia-ml.so.1"
_UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_NAME_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
_DRIVER_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
REPORT_TIMEOUT_S = 10.0
"""How long the report's PATCH may take: the kubelet restarts a program that fails, not one that hangs."""


class ReservationError(Exception):
    """What the program cannot vouch for; exit code 1 with this message."""


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """The few NVML calls the program makes, on a loaded ``libnvidia-ml`` (:meth:`load`)."""

    def __init__(self, library: Any) -> None:
        self._lib = library

    @classmethod
    def load(cls, name: str = NVML_LIBRARY) -> Nvml:
        """NVML from ``name``; :class:`ReservationError` when the container has no NVML (no GPU given, or
        a runtime without the ``utility`` capability)."""
        try:
            return cls(ctypes.CDLL(name))
        except OSError as exc:
            raise ReservationError(f"cannot load {name}: {exc} (was this container given a GPU?)") from exc

    def _call(self, function: str, *args: Any) -> None:
        code = getattr(self._lib, function)(*args)
        if code != 0:
            describe = self._lib.nvmlErrorString
            describe.restype = ctypes.c_char_p
            raise ReservationError(f"{function}: NVML error {code} ({describe(code).decode(errors='replace')})")

    def _text(self, function: str, handle: Any, size: int) -> str:
        buffer = ctypes.create_string_buffer(size)
        if handle is None:
            self._call(function, buffer, ctypes.c_uint(size))
        else:
            self._call(function, handle, buffer, ctypes.c_uint(size))
        return buffer.value.decode(errors="replace")

    def gpus(self) -> dict[str, Any]:
        """The driver and every GPU NVML shows this container: index, UUID, name, memory, PCI bus id."""
        self._call("nvmlInit_v2")
        try:
            count = ctypes.c_uint(0)
            self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
            found = []
            for index in range(count.value):
                handle = ctypes.c_void_p()
                self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
                memory = _Memory()
                self._call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(memory))
                found.append(
                    {
                        "index": index,
                        "uuid": self._text("nvmlDeviceGetUUID", handle, _UUID_BUFFER),
                        "name": self._text("nvmlDeviceGetName", handle, _NAME_BUFFER),
                        "memory_total_bytes": memory.total,
                    }
                )
            driver = self._text("nvmlSystemGetDriverVersion", None, _DRIVER_BUFFER)
        finally:
            self._lib.nvmlShutdown()
        return {"driver": driver, "gpus": found}


def plugin_uuids(environ: Mapping[str, str], device_dir: Path = DEVICE_LIST_DIR) -> list[str] | None:
    """The GPU UUIDs the device plugin's allocation names, where the container has a record of it: the
    files in ``device_dir`` (volume-mounts strategy), else ``NVIDIA_VISIBLE_DEVICES`` when it lists UUIDs
    (envvar strategy). None where neither names a UUID (indices, ``all``, ``void``, CDI).

    >>> plugin_uuids({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, Path("/nonexistent"))
    ['GPU-a', 'GPU-b']
    >>> plugin_uuids({"NVIDIA_VISIBLE_DEVICES": "0"}, Path("/nonexistent")) is None
    True
    """
    if device_dir.is_dir():
        names = sorted(p.name for p in device_dir.iterdir() if p.name.startswith(("GPU-", "MIG-")))
        if names:
            return names
    listed = [part.strip() for part in environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if listed and all(part.startswith(("GPU-", "MIG-")) for part in listed):
        return listed
    return None


def reserved_gpu(found: Mapping[str, Any], plugin: list[str] | None) -> str:
    """The one GPU this container holds: NVML's, agreeing with the device plugin's record where there is
    one; :class:`ReservationError` otherwise.

    >>> reserved_gpu({"gpus": [{"uuid": "GPU-a"}]}, ["GPU-a"])
    'GPU-a'
    >>> reserved_gpu({"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]}, None)
    Traceback (most recent call last):
    ...
    shares.reserve_gpu.ReservationError: expected exactly one GPU in this container, NVML shows 2: ['GPU-a', 'GPU-b']
    """
    uuids = [gpu["uuid"] for gpu in found.get("gpus", [])]
    if len(uuids) != 1:
        raise ReservationError(f"expected exactly one GPU in this container, NVML shows {len(uuids)}: {uuids}")
    if plugin is not None and plugin != uuids:
        raise ReservationError(
            f"NVML shows {', '.join(uuids)}, the device plugin allocated {', '.join(plugin)}: refusing to report either"
        )
    return str(uuids[0])


Opener = Callable[[urllib.request.Request], Any]


def report(
    uuid: str, environ: Mapping[str, str], account: Path = SERVICE_ACCOUNT, opener: Opener | None = None
) -> None:
    """Write ``uuid`` into this pod's :data:`RESERVED_GPU_ANNOTATION`, with the pod's own token.

    The pod is named by ``POD_NAMESPACE`` and ``POD_NAME`` (the downward API); the API server by
    ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``, as in every pod.
    """
    missing = [name for name in ("POD_NAMESPACE", "POD_NAME", "KUBERNETES_SERVICE_HOST") if not environ.get(name)]
    if missing:
        raise ReservationError(f"cannot name this pod or the API server: {', '.join(missing)} unset")
    host, port = environ["KUBERNETES_SERVICE_HOST"], environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    url = f"https://{host}:{port}/api/v1/namespaces/{environ['POD_NAMESPACE']}/pods/{environ['POD_NAME']}"
    body = json.dumps({"metadata": {"annotations": {RESERVED_GPU_ANNOTATION: uuid}}}).encode()
    token = (account / "token").read_text().strip()
    request = urllib.request.Request(url, data=body, method="PATCH")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/merge-patch+json")
    if opener is None:
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
        https = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        opener = partial(https.open, timeout=REPORT_TIMEOUT_S)
    try:
        with opener(request) as response:
            response.read()
    except OSError as exc:  # URLError and HTTPError are OSErrors
        raise ReservationError(f"reporting {uuid} on {environ['POD_NAMESPACE']}/{environ['POD_NAME']}: {exc}") from exc


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="report the GPU this reservation pod holds, then hold it")
    parser.add_argument("--discover", action="store_true", help="print what NVML and the device plugin show; exit")
    args = parser.parse_args(argv)
    env = os.environ if environ is None else environ
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # first: as PID 1, Python ignores it otherwise
    try:
        found = Nvml.load().gpus()
        plugin = plugin_uuids(env)
        if args.discover:
            print(json.dumps({**found, "device_plugin": plugin}, indent=1))
            return 0
        uuid = reserved_gpu(found, plugin)
        report(uuid, env)
    except ReservationError as exc:
        print(f"reserve-gpu: {exc}", file=sys.stderr)
        return 1
    print(f"reserve-gpu: holding {uuid}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
