"""The API double's objects (:mod:`testing.kube_double`): each kind's objects kept sorted by key (name, or
``namespace/name`` for a namespaced kind), the resourceVersion of the last write, and the snapshots that
the later pages of a paged list are served from."""

from __future__ import annotations

import bisect
import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from testing.kube_double_objects import KINDS, encode, raw
from testing.kube_double_requests import (
    ApiError,
    Route,
    decode_continue,
    encode_continue,
    int_param,
    parse_field_selector,
    parse_label_selector,
)

NAMESPACED = ("pods", "resourceclaims", "deployments", "poddisruptionbudgets")
SNAPSHOTS_KEPT = 8


@dataclass
class Entry:
    obj: dict[str, Any]
    raw: bytes  # the item as it appears in a list (no kind/apiVersion), compact


@dataclass
class Collection:
    entries: dict[str, Entry] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # sorted


class KubeStore:
    """Every object the double holds, by kind.

    ``lock`` guards it all: :meth:`entry`, :meth:`put` and :meth:`remove` expect the caller to hold it (a
    write reads, checks and stores under one hold); the other methods take it themselves.
    """

    def __init__(self, resource_version: int = 1) -> None:
        self.lock = threading.RLock()
        self.collections = {kind: Collection() for kind in KINDS}
        self.rv = resource_version
        self._snapshots: OrderedDict[tuple[str, int], tuple[list[str], dict[str, Entry]]] = OrderedDict()

    @staticmethod
    def key(kind: str, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if kind in NAMESPACED else name

    def load(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Add objects as they are, keeping their ``resourceVersion`` (fixtures) or assigning one."""
        collection = self.collections[kind]
        with self.lock:
            for source in objects:
                obj = copy.deepcopy(dict(source))
                obj.pop("kind", None)
                obj.pop("apiVersion", None)
                metadata = obj.setdefault("metadata", {})
                if kind in NAMESPACED:
                    metadata.setdefault("namespace", "default")
                if "resourceVersion" in metadata:
                    self.rv = max(self.rv, int(metadata["resourceVersion"]))
                else:
                    self.rv += 1
                    metadata["resourceVersion"] = str(self.rv)
                key = self.key(kind, metadata.get("namespace"), metadata["name"])
                if key not in collection.entries:
                    collection.keys.append(key)
                collection.entries[key] = Entry(obj, raw(obj))
            collection.keys.sort()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A deep copy of an object (for assertions); KeyError when absent."""
        with self.lock:
            return copy.deepcopy(self.collections[kind].entries[self.key(kind, namespace, name)].obj)

    def objects(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            collection = self.collections[kind]
            return [copy.deepcopy(collection.entries[key].obj) for key in collection.keys]

    def has(self, kind: str, namespace: str | None, name: str) -> bool:
        return self.key(kind, namespace, name) in self.collections[kind].entries

    # ---- writes (the caller holds the lock) --------------------------------------------------
    def entry(self, route: Route) -> Entry:
        """The object ``route`` names; 404 ``NotFound`` when there is none."""
        assert route.name is not None
        entry = self.collections[route.kind].entries.get(self.key(route.kind, route.namespace, route.name))
        if entry is None:
            raise ApiError(
                404, "NotFound", f'{route.kind} "{route.name}" not found', {"name": route.name, "kind": route.kind}
            )
        return entry

    def put(self, route: Route, obj: dict[str, Any]) -> None:
        """Store ``obj`` as the object ``route`` names, at the next resourceVersion (set in ``obj``)."""
        assert route.name is not None
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        collection = self.collections[route.kind]
        key = self.key(route.kind, route.namespace, route.name)
        if key not in collection.entries:
            bisect.insort(collection.keys, key)
        collection.entries[key] = Entry(obj, raw(obj))

    def remove(self, route: Route) -> None:
        assert route.name is not None
        collection = self.collections[route.kind]
        key = self.key(route.kind, route.namespace, route.name)
        del collection.entries[key]
        collection.keys.pop(bisect.bisect_left(collection.keys, key))
        self.rv += 1

    # ---- lists -------------------------------------------------------------------------------
    def list_response(self, route: Route, query: Mapping[str, str], api_version: str) -> bytes:
        """The list ``route`` names as the API server writes it: the items that match the query's selectors,
        one page of ``limit`` of them with a ``continue`` token where more follow (and
        ``remainingItemCount`` when the query has no selectors)."""
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), route.kind)
        limit = int_param(query, "limit")
        token = query.get("continue", "")
        prefix = f"{route.namespace}/" if route.namespace else ""
        rv, keys, entries, position = self._list_source(route.kind, token, prefix, limit)
        items: list[bytes] = []
        last_key = ""
        more = False
        end = len(keys)
        while position < end:
            key = keys[position]
            if not key.startswith(prefix):
                break
            entry = entries[key]
            position += 1
            if not (labels(entry.obj) and fields(entry.obj)):
                continue
            if limit and len(items) == limit:
                more = True
                position -= 1
                break
            items.append(entry.raw)
            last_key = key
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if more:
            start = last_key[len(prefix) :] + "\x00"
            metadata["continue"] = encode_continue(rv, start)
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                remaining = bisect.bisect_left(keys, prefix + "\U0010ffff") - position
                metadata["remainingItemCount"] = remaining
        head = encode({"kind": f"{KINDS[route.kind]}List", "apiVersion": api_version, "metadata": metadata})
        return head[:-2] + b',"items":[' + b",".join(items) + b"]}\n"

    def _list_source(
        self, kind: str, token: str, prefix: str, limit: int
    ) -> tuple[int, list[str], dict[str, Entry], int]:
        """What a list reads: its resourceVersion, the sorted keys and the entries, and the position of its
        first key. A continued list reads the snapshot its first page kept (410 ``Expired`` once that is
        gone, as after an etcd compaction); a first page with a ``limit`` keeps one."""
        with self.lock:
            if token:
                rv, start = decode_continue(token)
                snapshot = self._snapshots.get((kind, rv))
                if snapshot is None:
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You"
                        " can start a new list without the continue parameter, or use the continue token in"
                        " this response to retrieve the remainder of the results. Continuing with the provided"
                        " token results in an inconsistent list - objects that were created, modified, or"
                        " deleted between the time the first chunk was returned and now may show up in the list.",
                    )
                keys, entries = snapshot
                position = bisect.bisect_left(keys, prefix + start)
            else:
                rv = self.rv
                collection = self.collections[kind]
                keys, entries = collection.keys, collection.entries
                position = bisect.bisect_left(keys, prefix)
                if limit:
                    # Later pages are served from this snapshot, like etcd's MVCC read at rv.
                    keys, entries = list(keys), dict(entries)
                    self._snapshots[(kind, rv)] = (keys, entries)
                    while len(self._snapshots) > SNAPSHOTS_KEPT:
                        self._snapshots.popitem(last=False)
        return rv, keys, entries, position
