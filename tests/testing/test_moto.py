"""The local moto server keeps DynamoDB's contract that a conditional write on one item is atomic."""

from __future__ import annotations

import threading

import pytest

from adapters.gpu_ledger import LedgerStore
from bench.ledger import TABLE, create_table
from scheduler_core.state.ledger import NodeLedger
from testing.moto import moto_server

pytestmark = pytest.mark.server  # moto's server


def _race(stores: list[LedgerStore], version: int) -> list[int]:
    """Every store writes version + 1 of one item on the condition that it is still ``version``, all at
    once; the writers whose write succeeded."""
    barrier, winners = threading.Barrier(len(stores)), []

    def write(writer: int) -> None:
        claimed = NodeLedger("gpu-000", 8, version + 1, assignments={f"uid-{writer}": ((0, 100),)})
        barrier.wait()
        if stores[writer].write(claimed, version):
            winners.append(writer)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners


def test_concurrent_conditional_writes_on_one_item_have_one_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 writers read version v and race to write v + 1: exactly one may win each round. moto alone lets
    several win (it checks the condition, then stores, unlocked); a 1 us switch interval makes that show
    within a few dozen rounds, so this fails without the server's serialisation."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_server(switch_interval_s=1e-6) as endpoint:
        stores = [
            LedgerStore(TABLE, boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint))
            for _ in range(8)
        ]
        create_table(stores[0].client)
        assert stores[0].write(NodeLedger("gpu-000", 8, 1), 0)
        for version in range(1, 101):
            winners = _race(stores, version)
            assert len(winners) == 1, f"version {version}: writers {winners} all won it"
        assert stores[0].read("gpu-000", 8).version == 101
