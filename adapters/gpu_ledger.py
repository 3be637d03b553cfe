"""The GPU ledger in DynamoDB: one item per node, changed only by conditional writes on its version.

Many extender instances bind at once, each with its own snapshot copy, the way optimistic shared-state
schedulers do: read the node's item, choose GPUs from what it says is free, write the next version on
the condition that the version is still the one read. A conflict means another instance got there
first: re-read and choose again, once; after that the bind fails cleanly and kube-scheduler retries the
pod (DESIGN section 5).

Item: ``node`` (S, key), ``version`` (N), ``gpu_count`` (N), ``used`` (L of N, milli per GPU) and
``assignments`` (M of pod UID to ``"index:milli,..."``, the same text as the pod annotation).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from adapters.errors import AdapterError
from scheduler_core.errors import SchedulerCoreError
from scheduler_core.k8s.annotations import format_assigned_gpus, parse_assigned_gpus
from scheduler_core.k8s.names import MILLI_PER_GPU
from scheduler_core.state.ledger import Demand, NodeLedger, Pairs, choose_gpus


class LedgerStoreError(AdapterError):
    """The ledger could not be read or written (throttled past the retries, unreachable, malformed)."""


class LedgerConflictError(LedgerStoreError):
    """Every attempt lost the race to another writer of the same node; ``conflicts`` says how many."""

    def __init__(self, message: str, conflicts: int = 0) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class NoRoomError(LedgerStoreError):
    """The node's ledger has no room for the demand (the snapshot was stale); ``free`` is what it has,
    milli per GPU."""

    def __init__(self, message: str, free: tuple[int, ...] = (), holds: frozenset[str] | None = None) -> None:
        super().__init__(message)
        self.free = free
        self.holds = holds  # the pods the item holds with ``free``


@dataclass(frozen=True)
class Assigned:
    node: str
    pairs: Pairs
    conflicts: int  # version conflicts hit (and resolved) on the way
    already: bool  # the pod held this before: an idempotent repeat, nothing written
    free: tuple[int, ...] = ()  # the node's free milli per GPU after it, as the ledger has it
    opened: tuple[int, ...] = ()  # its GPUs that held no share before it: their reservation pods are new
    emptied: tuple[int, ...] = ()  # GPUs the same write left without shares (it dropped pods that are gone)
    holds: frozenset[str] | None = None  # the pods (UIDs) the node's item holds with ``free``

    @property
    def annotation(self) -> str:
        return format_assigned_gpus(self.pairs)


KEY = "node"
"""The table's partition key (a string): the node's name. ``cdk/state.py`` declares the same."""


def create_table(client: Any, table_name: str) -> bool:
    """Create the ledger's table (on-demand billing) and wait until it is active: what the CDK app deploys,
    for local runs against ``AWS_ENDPOINT_URL_DYNAMODB``. False when the table exists already.

    Raises
    ------
    LedgerStoreError
        DynamoDB refused or could not be reached; the message names the table and the cause.
    """
    try:
        client.create_table(
            TableName=table_name,
            KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
            return False
        raise LedgerStoreError(f"creating the GPU ledger table {table_name}: {_describe(exc)}") from exc
    except BotoCoreError as exc:
        raise LedgerStoreError(f"creating the GPU ledger table {table_name}: {type(exc).__name__}: {exc}") from exc
    client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return True


@dataclass(frozen=True)
class Released:
    """What :meth:`LedgerStore.release` did: whether the pod held something (the truth value), and the
    GPUs its release left without shares, whose reservation pods go."""

    held: bool
    emptied: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return self.held


class LedgerStore:
    """Reads and conditional writes of node items in table ``table_name`` through a boto3 DynamoDB client."""

    def __init__(self, table_name: str, client: Any) -> None:
        self.table, self.client = table_name, client
        # The item of each node as this instance last wrote or read it. A bind starts from it instead of
        # reading the item first: if another writer got there since, the conditional write fails and the
        # item is read. Only a round trip is saved; what is stored is decided by the conditional write.
        self._known: dict[str, NodeLedger] = {}

    def read(self, node: str, gpu_count: int) -> NodeLedger:
        """The node's item, strongly consistent; a node never written reads as empty (version 0)."""
        try:
            response = self.client.get_item(TableName=self.table, Key={"node": {"S": node}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(f"reading {node}", exc) from exc
        item = response.get("Item")
        ledger = NodeLedger(node, gpu_count) if item is None else _decode(node, item)
        self._known[node] = ledger
        return ledger

    def read_many(self, nodes: Sequence[str]) -> dict[str, NodeLedger]:
        """The items of ``nodes`` that exist, strongly consistent, 100 keys per ``BatchGetItem``."""
        found: dict[str, NodeLedger] = {}
        wanted = list(dict.fromkeys(nodes))
        for start in range(0, len(wanted), 100):
            keys: list[dict[str, Any]] = [{"node": {"S": node}} for node in wanted[start : start + 100]]
            for _attempt in range(5):
                request = {self.table: {"Keys": keys, "ConsistentRead": True}}
                try:
                    response = self.client.batch_get_item(RequestItems=request)
                except (ClientError, BotoCoreError) as exc:
                    raise self._error(f"reading {len(keys)} nodes", exc) from exc
                for item in response.get("Responses", {}).get(self.table, []):
                    node = item.get("node", {}).get("S", "")
                    found[node] = _decode(node, item)
                keys = response.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])
                if not keys:
                    break
            else:
                raise LedgerStoreError(f"the GPU ledger {self.table}: {len(keys)} keys still unprocessed after 5 tries")
        return found

    def scan(self) -> list[NodeLedger]:
        """Every node's item (the reconcile's view); strongly consistent, paginated."""
        items: list[NodeLedger] = []
        paginator = self.client.get_paginator("scan")
        try:
            for page in paginator.paginate(TableName=self.table, ConsistentRead=True):
                items.extend(_decode(item.get("node", {}).get("S", ""), item) for item in page.get("Items", []))
        except (ClientError, BotoCoreError) as exc:
            raise self._error("scanning", exc) from exc
        return items

    def write(self, ledger: NodeLedger, read_version: int) -> bool:
        """Put ``ledger`` if the stored version is still ``read_version``; False when it is not."""
        item = {
            "node": {"S": ledger.node},
            "version": {"N": str(ledger.version)},
            "gpu_count": {"N": str(ledger.gpu_count)},
            "used": {"L": [{"N": str(v)} for v in ledger.used]},
            "assignments": {"M": {uid: {"S": format_assigned_gpus(p)} for uid, p in ledger.assignments.items()}},
        }
        condition: dict[str, Any] = (
            {"ConditionExpression": "attribute_not_exists(#n)", "ExpressionAttributeNames": {"#n": "node"}}
            if read_version == 0
            else {
                "ConditionExpression": "#v = :read",
                "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {":read": {"N": str(read_version)}},
            }
        )
        try:
            self.client.put_item(TableName=self.table, Item=item, **condition)
        except ClientError as exc:
            self._known.pop(ledger.node, None)
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise self._error(f"writing {ledger.node}", exc) from exc
        except BotoCoreError as exc:
            self._known.pop(ledger.node, None)
            raise self._error(f"writing {ledger.node}", exc) from exc
        self._known[ledger.node] = ledger
        return True

    def _error(self, what: str, exc: ClientError | BotoCoreError) -> LedgerStoreError:
        """A DynamoDB failure, named: the table, what was being done, and the cause (an error code from
        the service, or botocore's own words when it never answered)."""
        cause = _describe(exc) if isinstance(exc, ClientError) else f"{type(exc).__name__}: {exc}"
        return LedgerStoreError(f"the GPU ledger {self.table}: {what}: {cause}")

    def assign(
        self,
        node: str,
        gpu_count: int,
        uid: str,
        demand: Demand,
        *,
        budget_s: float = 2.0,
        drop: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Assigned:
        """Record ``uid`` on ``node`` (:meth:`assign_many` for one pod).

        Raises :class:`NoRoomError` when the node's own item has no room, :class:`LedgerConflictError`
        naming the conflicts when the budget ran out.
        """
        (outcome,) = self.assign_many(
            node, gpu_count, [(uid, demand)], budget_s=budget_s, drop=drop, clock=clock, sleep=sleep
        ).values()
        if isinstance(outcome, NoRoomError):
            raise outcome
        return outcome

    def assign_many(
        self,
        node: str,
        gpu_count: int,
        demands: Sequence[tuple[str, Demand]],
        *,
        budget_s: float = 2.0,
        drop: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Assigned | NoRoomError]:
        """Record each ``(uid, demand)`` on ``node``, in order, in one conditional write: idempotent per
        UID; a pod that does not fit what is left gets a :class:`NoRoomError` and the others are written.
        The same write frees what the pods in ``drop`` (known to be gone) still hold there.

        A lost race re-reads the item and chooses the GPUs again from what it now holds, after a short
        jittered pause, for as long as ``budget_s`` lasts (kube-scheduler's ``httpTimeout`` bounds the
        whole bind, so the caller passes what is left of it). Raises :class:`LedgerConflictError` naming
        the conflicts when the budget ran out.
        """
        conflicts = 0
        deadline = clock() + budget_s
        # The item as this instance last saw it, instead of a read: if another writer got there since, the
        # write fails, which is no conflict to count, and the item is read. Only fresh reads are trusted to
        # say a pod is already recorded, or that it does not fit.
        known = self._known.get(node)
        read: NodeLedger | None = known if known is not None and known.gpu_count == gpu_count else None
        while True:
            fresh = read is None
            if read is None:
                read = self.read(node, gpu_count)
            outcome = _place(read, demands, drop)
            if not fresh and outcome.needs_fresh:
                read = None
                continue
            if outcome.updated is None:  # every pod recorded already, or none fits: nothing to write
                return outcome.results(conflicts, read)
            updated = outcome.updated
            updated = NodeLedger(node, updated.gpu_count, read.version + 1, updated.used, updated.assignments)
            if self.write(updated, read.version):
                return outcome.results(conflicts, updated)
            read = None
            if not fresh:
                continue
            conflicts += 1
            # Full jitter, growing with the conflicts: racing binders spread out instead of colliding again.
            pause = random.uniform(0, min(0.2, 0.01 * 2**conflicts))
            if clock() + pause >= deadline:
                raise LedgerConflictError(
                    f"{node}: lost {conflicts} conditional writes in a row to other binds of this node within "
                    f"{budget_s:.1f} s; kube-scheduler will retry the pod",
                    conflicts,
                )
            sleep(pause)

    def release(
        self, node: str, gpu_count: int, uid: str, *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep
    ) -> Released:
        """Free ``uid``'s assignment on ``node`` (a rollback, or a pod that is gone); true if it held one,
        with the GPUs left without shares. A lost race waits a jittered, growing moment before it reads
        again: binds from other instances keep writing the same item, and a release that gives up leaves
        GPUs held until the reconcile."""
        for attempt in range(attempts):
            ledger = self.read(node, gpu_count)
            if uid not in ledger.assignments:
                return Released(False)
            after = ledger.without(uid)
            if self.write(after, ledger.version):
                return Released(True, tuple(sorted(ledger.shared_slots() - after.shared_slots())))
            if attempt < attempts - 1:
                sleep(random.uniform(0, min(0.2, 0.01 * 2**attempt)))
        raise LedgerConflictError(f"{node}: could not release {uid} after {attempts} conflicts")


@dataclass
class _Placement:
    """What one pass of :meth:`LedgerStore.assign_many` makes of an item it read."""

    pairs: dict[str, Pairs]  # uid -> GPUs, for the pods written now
    already: dict[str, Pairs]  # uid -> GPUs, for the pods the item records already
    no_room: dict[str, str]  # uid -> why it does not fit
    updated: NodeLedger | None  # the item to write; None when nothing changes
    opened: dict[str, tuple[int, ...]] = field(default_factory=dict)  # uid -> its GPUs that held no share
    emptied: tuple[int, ...] = ()  # GPUs the drops leave without shares

    @property
    def needs_fresh(self) -> bool:
        """A pod recorded already, or one that does not fit: an item not freshly read may be wrong."""
        return bool(self.already or self.no_room)

    def results(self, conflicts: int, after: NodeLedger) -> dict[str, Assigned | NoRoomError]:
        free = tuple(after.free().tolist())
        node, holds = after.node, frozenset(after.assignments)
        found: dict[str, Assigned | NoRoomError] = {}
        for uid, pairs in self.already.items():
            found[uid] = Assigned(node, pairs, conflicts, True, free, holds=holds)
        for uid, pairs in self.pairs.items():
            opened = self.opened.get(uid, ())
            found[uid] = Assigned(node, pairs, conflicts, False, free, opened, self.emptied, holds)
        for uid, message in self.no_room.items():
            found[uid] = NoRoomError(message, free, holds)
        return found


def _place(read: NodeLedger, demands: Sequence[tuple[str, Demand]], drop: Collection[str]) -> _Placement:
    ledger = read
    for gone in drop:
        ledger = ledger.without(gone)
    placed = _Placement({}, {}, {}, None)
    shared = set(read.shared_slots())  # a GPU whose shares a drop takes still has its reservation pod
    for uid, demand in demands:
        if uid in read.assignments:
            placed.already[uid] = read.assignments[uid]
            continue
        pairs = choose_gpus(ledger.free(), demand)
        if pairs is None:
            placed.no_room[uid] = f"{read.node}: no room for {demand.num_gpu} x {demand.milli} milli in the GPU ledger"
            continue
        ledger = ledger.with_assignment(uid, pairs)
        placed.pairs[uid] = pairs
        if demand.milli < MILLI_PER_GPU:
            placed.opened[uid] = tuple(gpu for gpu, _ in pairs if gpu not in shared)
            shared.update(gpu for gpu, _ in pairs)
    if placed.pairs:
        placed.updated = ledger
        placed.emptied = tuple(sorted(read.shared_slots() - ledger.shared_slots()))
    return placed


def _decode(node: str, item: Mapping[str, Any]) -> NodeLedger:
    try:
        return NodeLedger(
            node,
            int(item["gpu_count"]["N"]),
            int(item["version"]["N"]),
            tuple(int(v["N"]) for v in item["used"]["L"]),
            {uid: parse_assigned_gpus(v["S"]) for uid, v in item["assignments"]["M"].items()},
        )
    except (KeyError, ValueError, TypeError, SchedulerCoreError) as exc:
        raise LedgerStoreError(f"the ledger item of {node} is malformed: {exc!r}") from exc


def _describe(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return f"{error.get('Code', 'error')}: {error.get('Message', '')}"
