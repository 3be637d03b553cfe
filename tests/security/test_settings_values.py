"""Settings a deployment or an environment may carry: a value no comparison can hold is refused by name.

``MAX_SNAPSHOT_AGE_S=nan`` (or ``maxSnapshotAgeS=nan`` in the CDK context, which passes it on) passed every
check (``nan < 60`` and ``nan < 0`` are both false); the extender then compared each snapshot's age with
NaN, never found one too old, and served from a snapshot of any age; the stale-snapshot alarm's threshold
was NaN too. Found by review on 2026-12-06, when the CDK key took the setting's own type (a float)."""

from __future__ import annotations

import pytest

from application.extender.settings import ExtenderSettings
from cdk.config import DeployConfig
from scheduler_core.errors import ConfigError


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_a_snapshot_age_no_comparison_can_hold_is_refused_by_the_lambda_and_the_synth(value: str) -> None:
    with pytest.raises(ConfigError, match=r"MAX_SNAPSHOT_AGE_S: must be a non-negative number of seconds"):
        ExtenderSettings.from_env({"MAX_SNAPSHOT_AGE_S": value})
    with pytest.raises(ConfigError, match=r"maxSnapshotAgeS: expected a finite number"):
        DeployConfig.from_context({"clusterName": "c", "maxSnapshotAgeS": value})


def test_a_finite_age_still_passes_and_reaches_the_lambda_as_written() -> None:
    from adapters.settings import environment

    config = DeployConfig.from_context({"clusterName": "c", "maxSnapshotAgeS": "240"})
    assert environment(ExtenderSettings, config)["MAX_SNAPSHOT_AGE_S"] == "240"
    with pytest.raises(
        ConfigError, match=r"maxSnapshotAgeS: expected >= 60 \(the refresher runs every minute\), got 59$"
    ):
        DeployConfig.from_context({"clusterName": "c", "maxSnapshotAgeS": "59"})
