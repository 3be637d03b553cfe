from decimal import Decimal

import pytest

from scheduler_core.k8s.quantity import MAX_QUANTITY_CHARS, parse_quantity, parse_whole_count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2", Decimal(2), id="a plain integer is taken as is"),
        pytest.param(3, Decimal(3), id="a JSON integer is accepted"),
        pytest.param("500m", Decimal("0.5"), id="milli suffix divides by 1000"),
        pytest.param("40Gi", Decimal(40 * 2**30), id="binary suffix multiplies by powers of 1024"),
        pytest.param("48G", Decimal(48 * 10**9), id="decimal suffix multiplies by powers of 1000"),
        pytest.param("1e3", Decimal(1000), id="decimal exponent"),
        pytest.param("1E", Decimal(10**18), id="a bare E is the exa suffix, not an exponent"),
        pytest.param("-1", Decimal(-1), id="a sign is kept"),
        pytest.param(".5", Decimal("0.5"), id="a leading dot is allowed"),
    ],
)
def test_quantity_grammar_matches_the_api_server(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "two", "1.5.2", "1Gb", "--1", "1e99999", None, 1.5, True])
def test_invalid_quantity_is_rejected_with_the_value_quoted(text):
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("1.5", "whole number", id="fractional GPUs are refused"),
        pytest.param("500m", "whole number", id="milli GPUs are refused"),
        pytest.param("-1", "non-negative", id="negative GPUs are refused"),
        pytest.param("lots", "quantity", id="garbage is refused"),
    ],
)
def test_whole_count_names_the_field_and_value(text, message):
    with pytest.raises(ValueError, match=rf"nvidia.com/gpu: .*{message}"):
        parse_whole_count(text, what="nvidia.com/gpu")


def test_whole_count_accepts_suffixed_integers():
    assert parse_whole_count("1k", what="x") == 1000


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("١٢", id="Arabic-Indic digits, which Decimal reads as 12"),
        pytest.param("٥٠٠m", id="Arabic-Indic digits with a suffix"),
        pytest.param("1e١", id="an Arabic-Indic exponent"),
    ],
)
def test_a_quantity_has_ascii_digits_only(text):
    with pytest.raises(ValueError, match="expected a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("9" * (MAX_QUANTITY_CHARS + 1), id="65 digits"),
        pytest.param("4" * 1_000_000, id="a million digits, which overflowed Decimal times 1000"),
        pytest.param("." + "0" * 5000 + "1", id="5,000 decimals"),
        pytest.param("1e" + "0" * 5000 + "1", id="an exponent of 5,000 digits"),
        pytest.param(10**MAX_QUANTITY_CHARS, id="a JSON integer of 65 digits"),
        pytest.param(10**5000, id="a JSON integer past repr's 4,300 digits"),
    ],
)
def test_a_quantity_past_its_length_is_out_of_range_and_not_echoed(value):
    with pytest.raises(ValueError, match="out of range: at most 64") as raised:
        parse_quantity(value)
    assert len(str(raised.value)) < 200


def test_a_quantity_of_the_longest_length_is_still_read():
    assert parse_quantity("1" + "0" * (MAX_QUANTITY_CHARS - 1)) == Decimal(10) ** (MAX_QUANTITY_CHARS - 1)
    assert parse_quantity(" 0." + "0" * 59 + "1m ") == Decimal("1e-63")  # surrounding spaces do not count


def test_a_whole_count_past_its_length_names_the_field():
    with pytest.raises(ValueError, match=r"^nvidia.com/gpu: '9+\.\.\. \(5000 characters\) is out of range"):
        parse_whole_count("9" * 5000, what="nvidia.com/gpu")
