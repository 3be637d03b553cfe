"""Kubernetes resource quantities (``resource.Quantity``), parsed exactly with :mod:`decimal`.

The grammar is the API server's: an optional sign, a decimal number, then either a binary suffix
(``Ki`` .. ``Ei``), a decimal suffix (``n u m k M G T P E``) or a decimal exponent (``e3``).
"""

from __future__ import annotations

import re
from decimal import Decimal

_QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?$")
_MULTIPLIER: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# Larger than any real quantity of GPUs or bytes; keeps "1e999999" from building a huge Decimal.
_MAX_EXPONENT = 30
MIB = 2**20


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into an exact :class:`~decimal.Decimal`.

    Parameters
    ----------
    value : str or int
        ``"2"``, ``"500m"``, ``"40Gi"``, ``"1e3"``; a JSON integer is accepted as well.

    Raises
    ------
    ValueError
        If ``value`` is not a quantity. The message quotes what arrived.

    Examples
    --------
    >>> parse_quantity("40Gi") == 40 * 2**30
    True
    >>> parse_quantity("500m")
    Decimal('0.500')
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected a quantity string, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"expected a Kubernetes quantity such as '2' or '40Gi', got {value!r}")
    sign, number, suffix, exponent = match.groups()
    result = Decimal(number)
    if exponent is not None:
        if abs(int(exponent)) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range in {value!r}")
        result = result.scaleb(int(exponent))
    else:
        result *= _MULTIPLIER[suffix or ""]
    return -result if sign == "-" else result


def parse_whole_count(value: object, *, what: str) -> int:
    """Parse a quantity that must be a non-negative whole number, such as ``nvidia.com/gpu``.

    >>> parse_whole_count("2", what="nvidia.com/gpu")
    2
    """
    if type(value) is str and value.isascii() and value.isdigit():
        return int(value)  # the common case ("1", "500"), without building a Decimal
    try:
        quantity = parse_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from exc
    if quantity < 0 or quantity != quantity.to_integral_value():
        raise ValueError(f"{what}: must be a non-negative whole number, got {value!r}")
    return int(quantity)
