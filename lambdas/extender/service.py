"""The extender Lambda's wiring: the snapshot source, this instance's ledger readings, and the GPU ledger
behind bind and preempt, built once from its settings into one :class:`Extender`.

It imports nothing the filter and prioritize path does not need: boto3 and botocore come with the
snapshot store, and the ``kubernetes`` client with the first bind.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from adapters.ledger_readings import LedgerReadings
from adapters.snapshot_store import RefreshEvent, SnapshotSource, open_store
from lambdas.extender.config import ExtenderSettings
from scheduler_core.extender.facade import Accounting, Extender


@dataclass(frozen=True, eq=False)
class ExtenderService:
    """The extender, and the snapshot source it decides from (None without ``SNAPSHOT_URI``)."""

    extender: Extender
    source: SnapshotSource | None


def build(
    settings: ExtenderSettings,
    *,
    trace: Callable[[str], AbstractContextManager[Any]] | None = None,
    on_refresh: Callable[[RefreshEvent], None] | None = None,
) -> ExtenderService:
    """The extender for ``settings``; ``trace`` wraps each snapshot refresh in a tracing subsegment and
    ``on_refresh`` hears how each one went."""
    source = None
    if settings.snapshot_uri:
        source = SnapshotSource(
            open_store(settings.snapshot_uri),
            refresh_s=settings.snapshot_refresh_s,
            max_age_s=settings.max_snapshot_age_s,
            trace=trace,
            on_refresh=on_refresh,
        )
    readings = LedgerReadings()
    accounting: Accounting | None = None
    if settings.ledger_table:
        from adapters.binder import ledger_binder

        accounting = ledger_binder(settings.ledger_table, settings, cluster=source, readings=readings)
    return ExtenderService(Extender(settings.extender_config(), source, readings, accounting), source)
