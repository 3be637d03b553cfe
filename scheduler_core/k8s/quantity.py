"""Kubernetes resource quantities (``resource.Quantity``), parsed exactly with :mod:`decimal`.

The grammar is the API server's: an optional sign, a decimal number, then either a binary suffix
(``Ki`` .. ``Ei``), a decimal suffix (``n u m k M G T P E``) or a decimal exponent (``e3``).
"""

from __future__ import annotations

import re
from decimal import Decimal

# re.ASCII: ``\d`` would match "١٢" (Arabic-Indic digits), which Decimal reads as 12 and the API server refuses.
_QUANTITY = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?$", re.ASCII
)
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
MAX_QUANTITY_CHARS = 64
"""The longest quantity read, sign and suffix included: an int64 has 19 digits and a nano-scale fraction
9 decimals, so no real quantity comes near. A longer one is out of range; it would otherwise build a
Decimal of any size, and a million digits times 1000 overflows Decimal's exponent range."""
_MAX_INT_BITS = 212  # a JSON integer of more than 64 digits (log2(10**64) = 212.6)
MIB = 2**20
MAX_COUNT = 2**31 - 1
"""The largest count a quantity may give (int32, as the arrays hold them)."""


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into an exact :class:`~decimal.Decimal`.

    Parameters
    ----------
    value : str or int
        ``"2"``, ``"500m"``, ``"40Gi"``, ``"1e3"``; a JSON integer is accepted as well.

    Raises
    ------
    ValueError
        If ``value`` is not a quantity (ASCII digits only), or is longer than
        :data:`MAX_QUANTITY_CHARS`. The message quotes what arrived, cut to 64 characters.

    Examples
    --------
    >>> parse_quantity("40Gi") == 40 * 2**30
    True
    >>> parse_quantity("500m")
    Decimal('0.500')
    >>> parse_quantity("9" * 5000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '999...9... (5000 characters) is out of range: at most 64 characters
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"expected a quantity string, got {type(value).__name__} {shown(value)}")
    if isinstance(value, int):
        if value.bit_length() > _MAX_INT_BITS:
            raise ValueError(f"{shown(value)} is out of range: at most {MAX_QUANTITY_CHARS} digits")
        return Decimal(value)
    text = value.strip()
    match = _QUANTITY.match(text)  # linear in the length: no repetition nests in the grammar
    if match is None:
        raise ValueError(f"expected a Kubernetes quantity such as '2' or '40Gi', got {shown(value)}")
    if len(text) > MAX_QUANTITY_CHARS:
        raise ValueError(f"{shown(value)} is out of range: at most {MAX_QUANTITY_CHARS} characters")
    sign, number, suffix, exponent = match.groups()
    result = Decimal(number)
    if exponent is not None:
        if abs(int(exponent)) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range in {shown(value)}")
        result = result.scaleb(int(exponent))
    else:
        result *= _MULTIPLIER[suffix or ""]
    return -result if sign == "-" else result


def unitless(value: str) -> bool:
    """Whether ``value`` is a quantity written as a bare number: no suffix, no exponent.

    >>> unitless("40960.5"), unitless("40Gi"), unitless("4e3")
    (True, False, False)
    """
    match = _QUANTITY.match(value.strip())
    return match is not None and match.group(3) is None and match.group(4) is None


def plain_int(value: object, *, max_digits: int = 18) -> int | None:
    """``value`` as an int when it is a string of ASCII digits, short enough to be a real count or
    size; None for anything else. ``str.isdigit`` alone admits ``"²"`` (which ``int`` refuses) and a
    5,000-digit string (past Python's 4,300-digit limit): both raise where a caller expects a number.

    >>> plain_int("8"), plain_int("²"), plain_int("9" * 5000), plain_int(" 8"), plain_int(8)
    (8, None, None, None, None)
    """
    if type(value) is str and 0 < len(value) <= max_digits and value.isascii() and value.isdigit():
        return int(value)
    return None


class CountOutOfRangeError(ValueError):
    """A whole count past :data:`MAX_COUNT`: a figure, only too large (a cap's business, not a garble)."""


def parse_whole_count(value: object, *, what: str) -> int:
    """Parse a quantity that must be a non-negative whole number, such as ``nvidia.com/gpu``.

    >>> parse_whole_count("2", what="nvidia.com/gpu")
    2
    """
    plain = plain_int(value)
    if plain is not None:
        return plain  # the common case ("1", "500"), without building a Decimal
    try:
        quantity = parse_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from exc
    if quantity < 0 or quantity != quantity.to_integral_value():
        raise ValueError(f"{what}: must be a non-negative whole number, got {shown(value)}")
    if quantity > MAX_COUNT:
        raise CountOutOfRangeError(f"{what}: {shown(value)} is out of range (at most {MAX_COUNT})")
    return int(quantity)


def shown(value: object, limit: int = 64) -> str:
    """``value`` for an error message, cut to ``limit`` characters: a hostile value can be megabytes, and
    ``repr`` of an integer past 4,300 digits raises. Long strings are cut before ``repr`` is taken.

    >>> shown("9" * 5000)
    "'99999999999999999999999999999999999999999999999999999999999999... (5000 characters)"
    >>> shown(10**5000)
    'an integer of 5001 digits'
    """
    if type(value) is int and value.bit_length() > _MAX_INT_BITS:
        # bit_length * log10(2) is the digit count within one: enough to say how large, without repr.
        return f"an integer of {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, str) and len(value) > limit:
        return f"{repr(value[:limit])[: limit - 1]}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
