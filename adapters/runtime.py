"""Process-level facts and tuning: the version installed (:func:`version`), and the allocator for the
scheduling hot path.

The vectorised core allocates a few arrays of n_nodes elements per call (hundreds of KB at 100,000
nodes). With glibc's defaults, an allocation that size is served by ``mmap`` or by heap memory that
was trimmed back to the kernel, so every call page-faults its arrays in again. In a sandboxed or
virtualised kernel (gVisor here, Firecracker on Lambda) a fault is expensive: on this machine it
made core filter + score at 100,000 nodes about 4x slower (``gpu-scheduler bench extender``
reports both). Raising the mmap and trim thresholds keeps that memory in the heap for reuse.
"""

from __future__ import annotations

import ctypes
import sys


def version() -> str:
    """The installed distribution's version (``pyproject.toml``'s): ``gpu-scheduler --version`` and the
    stack's ``Version`` output; ``unknown`` where it is not installed (a Lambda bundle)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("eks-gpu-scheduler")
    except PackageNotFoundError:
        return "unknown"


# mallopt(3) parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 64 * 2**20


def tune_allocator(
    mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES, trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES
) -> bool:
    """Keep freed arrays in the heap instead of returning them to the kernel.

    Returns True when glibc accepted both settings; False elsewhere (macOS, musl), where it does
    nothing. Costs at most ``trim_threshold_bytes`` of retained memory.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes)
    )
