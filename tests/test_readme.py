"""The README's reference tables are the code's, not a copy that drifts."""

from __future__ import annotations

from adapters.metric_catalogue import markdown_table
from tests.conftest import REPO


def test_the_readme_carries_the_metric_catalogue_exactly() -> None:
    assert markdown_table() in (REPO / "README.md").read_text()
