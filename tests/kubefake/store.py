"""The object store: objects by resource, namespace and name, with resourceVersions and watches.

As the API server over etcd (documented in "API Concepts: Efficient detection of
changes" and "Resource versions"):

* every write takes the next cluster-wide resourceVersion (monotonic), a list
  answers with the version it was read at, and a watch from a version streams
  every later change (ADDED, MODIFIED, DELETED) in order;
* only the last ``window`` changes are kept (etcd compaction and the watch
  cache's window); a watch from a version older than that is answered with a
  410 Gone (``Expired``) ERROR event, and the client must list again.
  ``window`` is configurable and ``compact()`` drops all history at once, so a
  test can force a 410;
* a watch with a selector sees an object that stops matching as DELETED and one
  that starts matching as ADDED.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.kubefake.resources import Resource
from tests.kubefake.selectors import match_fields, match_labels
from tests.kubefake.status import expired

Key = tuple[str, str, str, str]  # group, plural, namespace, name


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_of(resource: Resource, namespace: str, name: str) -> Key:
    return (resource.group, resource.plural, namespace if resource.namespaced else "", name)


@dataclass
class Event:
    rv: int
    type: str
    resource: Resource
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


@dataclass
class Watcher:
    resource: Resource
    namespace: str
    label_selector: str
    field_selector: str
    queue: deque[dict[str, Any]] = field(default_factory=deque)
    closed: bool = False

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        if self.label_selector and not match_labels(self.label_selector, meta.get("labels")):
            return False
        return not self.field_selector or match_fields(self.field_selector, obj)

    def offer(self, event: Event) -> None:
        if (event.resource.group, event.resource.plural) != (
            self.resource.group,
            self.resource.plural,
        ):
            return
        now_in, was_in = self._matches(event.obj), self._matches(event.old)
        kind = event.type
        if kind == "MODIFIED" and now_in and not was_in:
            kind = "ADDED"
        elif kind == "MODIFIED" and was_in and not now_in:
            kind = "DELETED"
        elif not (now_in or (kind == "DELETED" and was_in)):
            return
        if kind == "MODIFIED" and not now_in:
            return
        self.queue.append({"type": kind, "object": copy.deepcopy(event.obj)})


class Store:
    def __init__(self, window: int = 1000) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.rv = 0
        self.objects: dict[Key, tuple[Resource, dict[str, Any]]] = {}
        self.history: deque[Event] = deque()
        self.compacted = 0  # events up to this version are gone
        self.window = window
        self.watchers: list[Watcher] = []
        self.listeners: list[Callable[[Event], None]] = []

    # -- writes ----------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        self.history.append(event)
        while len(self.history) > self.window:
            self.compacted = self.history.popleft().rv
        for watcher in self.watchers:
            watcher.offer(event)
        self.cond.notify_all()
        for listener in list(self.listeners):
            listener(event)

    def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            stored = copy.deepcopy(obj)
            meta = stored.setdefault("metadata", {})
            if not resource.namespaced:
                meta.pop("namespace", None)
            self.rv += 1
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=str(self.rv),
                creationTimestamp=now(),
                generation=1,
            )
            key = key_of(resource, meta.get("namespace", ""), meta["name"])
            self.objects[key] = (resource, stored)
            self._emit(Event(self.rv, "ADDED", resource, copy.deepcopy(stored)))
            return copy.deepcopy(stored)

    def update(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            meta = obj["metadata"]
            key = key_of(resource, meta.get("namespace", ""), meta["name"])
            _, old = self.objects[key]
            stored = copy.deepcopy(obj)
            body = {k: v for k, v in stored.items() if k not in ("metadata", "status")}
            old_body = {k: v for k, v in old.items() if k not in ("metadata", "status")}
            self.rv += 1
            stored["metadata"].update(
                uid=old["metadata"]["uid"],
                creationTimestamp=old["metadata"]["creationTimestamp"],
                resourceVersion=str(self.rv),
                generation=old["metadata"].get("generation", 1) + (body != old_body),
            )
            self.objects[key] = (resource, stored)
            self._emit(
                Event(self.rv, "MODIFIED", resource, copy.deepcopy(stored), copy.deepcopy(old))
            )
            return copy.deepcopy(stored)

    def delete(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            found = self.objects.pop(key_of(resource, namespace, name), None)
            if found is None:
                return None
            self.rv += 1
            gone = copy.deepcopy(found[1])
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self._emit(Event(self.rv, "DELETED", resource, copy.deepcopy(gone), found[1]))
            return gone

    def compact(self) -> None:
        """Drop every change kept so far: a watch from an older version gets 410 Gone."""
        with self.cond:
            self.history.clear()
            self.compacted = self.rv

    # -- reads -----------------------------------------------------------------------------
    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            found = self.objects.get(key_of(resource, namespace, name))
            return None if found is None else copy.deepcopy(found[1])

    def list(
        self,
        resource: Resource,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[dict[str, Any]], int]:
        with self.cond:
            probe = Watcher(resource, namespace, label_selector, field_selector)
            items = [
                copy.deepcopy(obj)
                for (group, plural, _, _), (_, obj) in sorted(self.objects.items())
                if (group, plural) == (resource.group, resource.plural) and probe._matches(obj)
            ]
            return items, self.rv

    def all_objects(self) -> list[tuple[Resource, dict[str, Any]]]:
        with self.cond:
            return [(r, copy.deepcopy(o)) for r, o in self.objects.values()]

    def watch(
        self,
        resource: Resource,
        namespace: str,
        label_selector: str,
        field_selector: str,
        since: int | None,
    ) -> Watcher:
        """A registered watcher holding the events after ``since`` (every object when None)."""
        with self.cond:
            watcher = Watcher(resource, namespace, label_selector, field_selector)
            if since is None or since == 0:
                for obj in self.list(resource, namespace, label_selector, field_selector)[0]:
                    watcher.queue.append({"type": "ADDED", "object": obj})
            elif since < self.compacted:
                raise expired(since, self.compacted + 1)
            else:
                for event in self.history:
                    if event.rv > since:
                        watcher.offer(event)
            self.watchers.append(watcher)
            return watcher

    def next_events(self, watcher: Watcher, timeout: float) -> list[dict[str, Any]]:
        with self.cond:
            if not watcher.queue and not watcher.closed:
                self.cond.wait(timeout)
            events = list(watcher.queue)
            watcher.queue.clear()
            return events

    def stop_watch(self, watcher: Watcher) -> None:
        with self.cond:
            watcher.closed = True
            if watcher in self.watchers:
                self.watchers.remove(watcher)
            self.cond.notify_all()

    def close_all(self) -> None:
        with self.cond:
            for watcher in list(self.watchers):
                watcher.closed = True
            self.watchers.clear()
            self.cond.notify_all()
