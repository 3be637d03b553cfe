"""The DynamoDB GPU ledger: conditional writes, idempotency, conflicts and faults, in moto. The 8-way
concurrency run goes through the whole bind verb: ``tests/shares/test_binder.py``."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from adapters.gpu_ledger import LedgerConflictError, LedgerStore, LedgerStoreError, NoRoomError
from bench.ledger import TABLE, create_table
from scheduler_core.state.ledger import Demand
from tests.conftest import RacingClient


@pytest.fixture
def store(aws_session: Any) -> LedgerStore:
    client = aws_session.client("dynamodb")
    create_table(client)
    return LedgerStore(TABLE, client)


def test_a_bind_writes_the_chosen_gpus_and_the_next_version(store: LedgerStore) -> None:
    first = store.assign("gpu-a", 4, "uid-1", Demand(1, 250))
    second = store.assign("gpu-a", 4, "uid-2", Demand(1, 500))
    assert (first.annotation, second.annotation) == ("0:250", "0:500")  # the tightest GPU that fits
    ledger = store.read("gpu-a", 4)
    assert ledger.version == 2 and ledger.used == (750, 0, 0, 0) and ledger.problems() == []


def test_a_repeated_bind_returns_the_same_gpus_and_writes_nothing(store: LedgerStore) -> None:
    first = store.assign("gpu-a", 4, "uid-1", Demand(2, 1000))
    again = store.assign("gpu-a", 4, "uid-1", Demand(2, 1000))
    assert again.pairs == first.pairs == ((0, 1000), (1, 1000)) and again.already and not first.already
    assert store.read("gpu-a", 4).version == 1


def test_a_full_node_says_so(store: LedgerStore) -> None:
    store.assign("gpu-a", 1, "uid-1", Demand(1, 800))
    with pytest.raises(NoRoomError, match="gpu-a: no room for 1 x 300 milli"):
        store.assign("gpu-a", 1, "uid-2", Demand(1, 300))


def test_release_frees_the_gpus_and_is_false_for_a_pod_that_held_none(store: LedgerStore) -> None:
    store.assign("gpu-a", 2, "uid-1", Demand(1, 600))
    released = store.release("gpu-a", 2, "uid-1")
    assert released.held is True and bool(released) and released.emptied == (0,)
    assert store.release("gpu-a", 2, "uid-1").held is False
    assert store.read("gpu-a", 2).used == (0, 0)


def test_the_writes_say_which_gpus_gain_their_first_share_and_which_lose_their_last(store: LedgerStore) -> None:
    """What reservation pods follow: a GPU opens with its first share (never with a whole-GPU pod), stays
    open while any share is on it, and a release empties it only with its last share."""
    whole = store.assign("gpu-a", 4, "whole", Demand(1, 1000))
    first = store.assign("gpu-a", 4, "first", Demand(1, 600))
    second = store.assign("gpu-a", 4, "second", Demand(1, 300))  # the tightest GPU: first's
    third = store.assign("gpu-a", 4, "third", Demand(1, 500))  # no room beside them: a new GPU
    assert (whole.opened, first.opened, second.opened, third.opened) == ((), (1,), (), (2,))
    assert store.release("gpu-a", 4, "first").emptied == ()
    assert store.release("gpu-a", 4, "second").emptied == (1,)
    assert store.release("gpu-a", 4, "whole").emptied == ()
    assert store.read("gpu-a", 4).shared_slots() == {2}


def test_a_write_that_drops_gone_pods_says_which_gpus_it_emptied(store: LedgerStore) -> None:
    """A bind drops the shares the live state saw go in its own write; the GPU they leave without shares
    is reported, and a GPU a new share takes over in the same write is not (its reservation pod stays)."""
    store.assign("gpu-a", 4, "gone-0", Demand(1, 600))  # GPU 0
    store.assign("gpu-a", 4, "gone-1", Demand(1, 700))  # GPU 1
    (outcome,) = store.assign_many("gpu-a", 4, [("new", Demand(1, 900))], drop=["gone-0", "gone-1"]).values()
    assert not isinstance(outcome, NoRoomError)
    assert outcome.pairs == ((0, 900),) and outcome.opened == () and outcome.emptied == (1,)


def test_a_version_conflict_rereads_and_chooses_again(store: LedgerStore) -> None:
    racing = LedgerStore(TABLE, RacingClient(store.client, store, races=1))
    assigned = racing.assign("gpu-a", 2, "uid-1", Demand(1, 800))
    assert assigned.conflicts == 1
    ledger = store.read("gpu-a", 2)
    # The rival took 300 of GPU 0, so the second choice is GPU 1 (GPU 0 has only 700 left).
    assert assigned.pairs == ((1, 800),) and ledger.used == (300, 800) and ledger.problems() == []


def test_conflicts_are_retried_with_a_fresh_choice_while_the_budget_lasts(store: LedgerStore) -> None:
    racing = LedgerStore(TABLE, RacingClient(store.client, store, races=3))
    assigned = racing.assign("gpu-a", 2, "uid-1", Demand(1, 600), sleep=lambda _s: None)
    # Three rivals took 900 of GPU 0 (300 each, as they came), so 600 could only go on GPU 1.
    assert assigned.conflicts == 3 and assigned.pairs == ((1, 600),)
    assert store.read("gpu-a", 2).problems() == []


def test_losing_every_attempt_within_the_budget_fails_cleanly_naming_the_conflicts(store: LedgerStore) -> None:
    racing = LedgerStore(TABLE, RacingClient(store.client, store, races=5))
    ticks = iter(range(100))  # a second passes at each look at the clock
    with pytest.raises(LedgerConflictError, match="lost 2 conditional writes in a row to other binds of this node"):
        racing.assign(
            "gpu-a", 2, "uid-1", Demand(1, 100), budget_s=1.5, clock=lambda: float(next(ticks)), sleep=lambda _s: None
        )
    assert "uid-1" not in store.read("gpu-a", 2).assignments


def test_throttling_is_a_clear_error_and_writes_nothing(store: LedgerStore) -> None:
    client = boto3.client("dynamodb", region_name="us-east-1")
    with Stubber(client) as stub:
        stub.add_client_error(
            "get_item", service_error_code="ProvisionedThroughputExceededException", service_message="Rate exceeded"
        )
        with pytest.raises(LedgerStoreError, match=f"GPU ledger {TABLE}: reading gpu-a: ProvisionedThroughputExceeded"):
            LedgerStore(TABLE, client).assign("gpu-a", 2, "uid-1", Demand(1, 100))
    assert store.read("gpu-a", 2).version == 0


def test_an_unreachable_dynamodb_is_a_ledger_error_naming_the_table_not_a_crash() -> None:
    from botocore.config import Config

    from adapters.gpu_ledger import create_table as create
    from testing.processes import free_port

    client = boto3.client(
        "dynamodb", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="testing", aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1),
    )  # fmt: skip
    ledger = LedgerStore(TABLE, client)
    for call in (lambda: ledger.assign("gpu-a", 2, "uid-1", Demand(1, 100)), ledger.scan,
                 lambda: ledger.read_many(["gpu-a"]), lambda: create(client, TABLE)):  # fmt: skip
        with pytest.raises(LedgerStoreError, match=f"{TABLE}.*EndpointConnectionError"):
            call()


def test_a_malformed_item_is_named_not_trusted(store: LedgerStore) -> None:
    store.client.put_item(TableName=TABLE, Item={"node": {"S": "gpu-a"}, "version": {"N": "3"}})
    with pytest.raises(LedgerStoreError, match="the ledger item of gpu-a is malformed"):
        store.assign("gpu-a", 2, "uid-1", Demand(1, 100))


def test_a_missing_item_is_created_on_the_first_bind_and_a_second_creator_conflicts(store: LedgerStore) -> None:
    empty = store.read("gpu-b", 2)
    assert empty.version == 0
    assert store.write(empty.with_assignment("a", ((0, 100),)), 0) is True
    assert store.write(empty.with_assignment("b", ((0, 100),)), 0) is False  # attribute_not_exists fails
    assert set(store.read("gpu-b", 2).assignments) == {"a"}


def test_any_other_client_error_is_wrapped_with_the_node(store: LedgerStore) -> None:
    client = boto3.client("dynamodb", region_name="us-east-1")
    with Stubber(client) as stub:
        stub.add_response("get_item", {})
        stub.add_client_error("put_item", service_error_code="ResourceNotFoundException", service_message="no table")
        with pytest.raises(LedgerStoreError, match=f"the GPU ledger {TABLE}: writing gpu-a: ResourceNotFoundException"):
            LedgerStore(TABLE, client).assign("gpu-a", 2, "uid-1", Demand(1, 100))


class CountingReads:
    """The real client, counting GetItem calls."""

    def __init__(self, client: Any) -> None:
        self.client, self.reads = client, 0

    def get_item(self, **kwargs: Any) -> Any:
        self.reads += 1
        return self.client.get_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_binds_after_the_first_start_from_the_item_this_instance_wrote(store: LedgerStore) -> None:
    counting = CountingReads(store.client)
    ours = LedgerStore(TABLE, counting)
    for i in range(4):
        ours.assign("gpu-a", 4, f"uid-{i}", Demand(1, 250))
    assert counting.reads == 1, "one read for the first bind, none after: each write's item is known"
    assert store.read("gpu-a", 4).used == (1000, 0, 0, 0)


def test_another_writer_in_between_costs_one_read_and_no_conflict(store: LedgerStore) -> None:
    counting = CountingReads(store.client)
    ours, theirs = LedgerStore(TABLE, counting), LedgerStore(TABLE, store.client)
    ours.assign("gpu-a", 2, "uid-1", Demand(1, 500))
    theirs.assign("gpu-a", 2, "uid-2", Demand(1, 500))  # GPU 0 is full now; ours does not know
    third = ours.assign("gpu-a", 2, "uid-3", Demand(1, 500))
    assert third.pairs == ((1, 500),) and third.conflicts == 0
    assert store.read("gpu-a", 2).assignments.keys() == {"uid-1", "uid-2", "uid-3"}


def test_a_known_item_never_says_a_pod_is_recorded_without_a_fresh_read(store: LedgerStore) -> None:
    """This instance recorded uid-1, another released it (a rollback elsewhere): a retried bind of uid-1
    must record it again, not trust the old item and post a Binding the ledger does not hold."""
    ours, theirs = LedgerStore(TABLE, store.client), LedgerStore(TABLE, store.client)
    ours.assign("gpu-a", 1, "uid-1", Demand(1, 600))
    assert theirs.release("gpu-a", 1, "uid-1").held is True
    again = ours.assign("gpu-a", 1, "uid-1", Demand(1, 600))
    assert not again.already and store.read("gpu-a", 1).assignments == {"uid-1": ((0, 600),)}


def test_a_known_full_item_is_read_again_before_no_room(store: LedgerStore) -> None:
    ours, theirs = LedgerStore(TABLE, store.client), LedgerStore(TABLE, store.client)
    ours.assign("gpu-a", 1, "uid-1", Demand(1, 800))
    theirs.release("gpu-a", 1, "uid-1")
    assert ours.assign("gpu-a", 1, "uid-2", Demand(1, 900)).pairs == ((0, 900),)
