"""``python -m bench.quality``: the packing bounds of ``--floor``, the tables, the paired comparison, ``--resume``."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.quality import reuse, share_packing_bounds


def _optimum(items: list[int], capacity: int = 1000) -> int:
    """The fewest bins, by trying every assignment (small inputs only)."""
    for bins in range(1, len(items) + 1):
        for assignment in itertools.product(range(bins), repeat=len(items)):
            load = [0] * bins
            for item, b in zip(items, assignment, strict=True):
                load[b] += item
            if max(load) <= capacity:
                return bins
    return len(items)


def test_bounds_on_hand_built_shares() -> None:
    assert share_packing_bounds([810, 810, 470, 470, 320, 160]) == (4, 4)  # 810+160, 810, 470+470, 320
    assert share_packing_bounds([600, 600, 600]) == (3, 3)  # sum/1000 says 2; no two fit together
    assert share_packing_bounds([]) == (0, 0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=999), min_size=1, max_size=6))
def test_the_optimum_lies_between_the_lower_bound_and_first_fit_decreasing(items: list[int]) -> None:
    lower, ffd = share_packing_bounds(items)
    assert math.ceil(sum(items) / 1000) <= lower <= _optimum(items) <= ffd <= len(items)


def test_table_and_plot_from_runs(tmp_path) -> None:
    from bench.quality import plot, table

    runs = [
        {"trace": trace, "policy": policy, "seed": seed, "unalloc_100": value + seed / 100, "seconds": 1.0}
        for trace, base in (("default", 5.0), ("cpu250", 8.0))
        for policy, value in (("fgd", base), ("fgd_cpu", base - 0.5))
        for seed in (0, 2)
    ]
    published = {("default", "06-FGD"): 4.77, ("cpu250", "06-FGD"): 6.80}
    text = table(runs, ["fgd", "fgd_cpu"], ["cpu250", "default"], published).splitlines()
    assert text[0] == "| trace | fgd (released) | fgd_cpu (ours) |"
    assert text[2:] == ["| cpu250 | 8.01 (6.80) | 7.51 |", "| default | 5.01 (4.77) | 4.51 |"]
    unreleased = table(runs, ["fgd", "fgd_cpu"], ["cpu250"], {}).splitlines()
    assert unreleased[2] == "| cpu250 | 8.01 (-) | 7.51 |"
    plot(runs, ["fgd", "fgd_cpu"], ["cpu250", "default"], published, tmp_path / "q.png")
    assert (tmp_path / "q.png").read_bytes().startswith(b"\x89PNG")


def test_traces_are_picked_by_group_or_by_name() -> None:
    from bench.quality import pick_traces

    present = ["cpu0", "cpu250", "default", "gpuspec05"]
    public = {"cpu250", "default"}
    assert pick_traces("public", present, public) == ["cpu250", "default"]
    assert pick_traces("unreleased", present, public) == ["cpu0", "gpuspec05"]
    assert pick_traces("all", present, public) == present
    assert pick_traces("gpuspec05, default", present, public) == ["gpuspec05", "default"]
    with pytest.raises(ValueError, match="--traces: unknown nope; choose from cpu0, cpu250, default, gpuspec05"):
        pick_traces("default,nope", present, public)


def _runs(values: dict[str, list[float]]) -> list[dict[str, object]]:
    return [
        {"trace": "default", "policy": policy, "seed": 42 + i // 5, "tie_order": i % 5, "unalloc_100": v}
        for policy, series in values.items()
        for i, v in enumerate(series)
    ]


def test_the_paired_comparison_pairs_runs_by_seed_and_tie_order() -> None:
    from bench.quality import paired, paired_table, verdict

    fgd = [4.0 + 0.1 * (i % 7) for i in range(50)]
    better = paired(_runs({"fgd": fgd, "fgd_cpu": [v - 0.2 for v in fgd]}), "default", "fgd_cpu")
    assert better["pairs"] == 50 and math.isclose(better["mean"], -0.2) and verdict(better) == "better"
    noisy = [v + (0.3 if i % 2 else -0.3) for i, v in enumerate(fgd)]
    assert verdict(paired(_runs({"fgd": fgd, "fgd_cpu": noisy}), "default", "fgd_cpu")) == "equal"
    worse = _runs({"fgd": fgd, "fgd_cpu": [v + 0.1 for v in fgd][::-1]})
    assert verdict(paired(worse, "default", "fgd_cpu")) in ("worse", "equal")
    assert "| default | 4.29 | fgd_cpu | 4.09 | -0.20 [-0.20, -0.20] (50 pairs) | better |" in paired_table(
        _runs({"fgd": fgd, "fgd_cpu": [v - 0.2 for v in fgd]}), ["fgd_cpu"], ["default"]
    )


@pytest.mark.parametrize("text", ["{not json", '{"runs": [{"trace": "default"}]}', "[1]"])
def test_resume_names_the_file_it_cannot_read_and_keeps_it(tmp_path, text: str) -> None:
    path = tmp_path / "quality.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"--resume: {path} is not the JSON that --out writes"):
        reuse(path, [("default", "fgd", 42, 0)])
    assert path.read_text() == text
