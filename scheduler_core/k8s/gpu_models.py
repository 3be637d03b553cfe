"""GPU model names: one normaliser for node labels, GFD product names and pod annotations.

NVIDIA GPU Feature Discovery publishes ``nvidia.com/gpu.product`` as the marketing name with dashes,
for example ``NVIDIA-A100-SXM4-40GB``, ``Tesla-T4`` or ``NVIDIA-H100-80GB-HBM3``. With time-slicing
(``replicas > 1``) it appends ``-SHARED``; with MIG it appends the profile, ``-MIG-1g.5gb``. The
project labels and pod annotations use the short family name (``A100``). Everything is compared
after :func:`normalize_model`, so ``a100``, ``A100`` and ``NVIDIA-A100-SXM4-80GB`` all match.
"""

from __future__ import annotations

import re

# A Kubernetes label value: alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_MIG_SUFFIX = re.compile(r"-MIG-.*$")
_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "QUADRO", "GEFORCE"})
_SERIES_WORDS = frozenset({"RTX", "GTX"})


def normalize_model(raw: str) -> str | None:
    """Map a GPU model or GFD product name to its short upper-case family name.

    Returns ``None`` when ``raw`` is not a usable model name (empty, or characters that are not
    allowed in a label value), so callers can report it instead of raising.

    Examples
    --------
    >>> normalize_model("NVIDIA-A100-SXM4-40GB-SHARED")
    'A100'
    >>> normalize_model("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    'A100'
    >>> normalize_model("Tesla-T4"), normalize_model("l40s")
    ('T4', 'L40S')
    >>> normalize_model("A100!") is None
    True
    """
    text = raw.strip().replace(" ", "-")
    if not _LABEL_VALUE.match(text):
        return None
    text = text.upper()
    text = text.removesuffix("-SHARED")
    text = _MIG_SUFFIX.sub("", text)
    parts = [part for part in re.split(r"[-_]", text) if part]
    while parts and parts[0] in _VENDOR_WORDS:
        parts.pop(0)
    if not parts:
        return None
    if parts[0] in _SERIES_WORDS and len(parts) > 1:
        # "NVIDIA-RTX-A6000" -> "RTXA6000": the series word alone does not name a model.
        return parts[0] + parts[1]
    return parts[0]
