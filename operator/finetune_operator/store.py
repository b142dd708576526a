"""Jobs and their pods as the operator's watches last delivered them, so a reconcile pass reads nothing.

The kopf handlers feed every FineTuneJob and trainer-pod event in (:meth:`Store.put_job`, :meth:`Store.put_pod`);
a pass takes its inputs from here. Three rules keep it as correct as a fresh read:

* **Newer wins**: an object is replaced only by one with a higher resourceVersion, so a late watch event never
  rolls back what a write answered or a list returned.
* **Trust after one list**: a job's pods are served from memory only once they have been listed for that job
  (the first pass after the operator starts lists them once): the pod watch's initial listing may arrive after
  the job's first event, and a pod missing from memory must never read as a pod that vanished.
* **Expectations**: after a pass creates or deletes pods, the job's next passes wait (the controller skips them)
  until the watch has delivered every one of those changes, each of which starts a pass of its own, or until
  :data:`EXPECTATION_TTL` passes, as the Kubernetes controllers do; a pass that runs meanwhile anyway lists.

Pods are kept as what a pass reads of them (:class:`finetune_operator.state.PodState`), not as the API's objects: a
few hundred bytes each instead of tens of KiB, which is what lets one operator hold thousands of pods. Jobs are kept
whole and shared, not copied: a put hands its object over (the handlers pass their own copy of kopf's body, a list
its freshly parsed items) and a read returns the stored object itself; nothing mutates them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from finetune_operator.state import PodState, read_pod

Key = tuple[str, str]
EXPECTATION_TTL = 30.0  # seconds: a change the watch never delivers stops forcing lists after this


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class Store:
    def __init__(self, *, clock: Any = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Key, dict[str, Any]] = {}
        self._pods: dict[Key, dict[str, PodState]] = {}
        self._listed: set[Key] = set()
        self._list_rv: dict[Key, int] = {}  # the resourceVersion of the job's last pod list
        self._events: dict[Key, int] = {}  # pod events applied per job (a list racing them is not trusted)
        self._expect: dict[Key, tuple[set[str], float]] = {}  # pending "add:<name>" / "del:<uid>", deadline
        self._clock = clock
        self._relisted_at = float("-inf")

    # -- jobs ----------------------------------------------------------------------------------------

    def put_job(self, job: dict[str, Any]) -> bool:
        """Store ``job`` unless an equal or newer version is stored, whatever its uid (resourceVersions are the
        store's one sequence: a list taken before a job was deleted and created again must not put the dead uid
        back); False when nothing changed (an echo of a write this operator made, or a stale event)."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        with self._lock:
            held = self._jobs.get(key)
            if held is not None and _rv(held) >= _rv(job):
                return False
            self._jobs[key] = job
            return True

    def newer_than(self, key: Key, version: int) -> bool:
        """The stored job is newer than ``version`` (a list's): it came from a watch event after that list."""
        with self._lock:
            held = self._jobs.get(key)
            return held is not None and _rv(held) > version

    def job(self, key: Key) -> dict[str, Any] | None:
        with self._lock:
            return self._jobs.get(key)

    def jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        with self._lock:
            return [j for (ns, _), j in self._jobs.items() if namespace is None or ns == namespace]

    def forget_job(self, key: Key) -> None:
        """A deleted job, or one whose stored version a write found stale (the next pass reads it)."""
        with self._lock:
            self._jobs.pop(key, None)

    def drop(self, key: Key) -> None:
        """Everything about a deleted job."""
        with self._lock:
            self._jobs.pop(key, None)
            self._pods.pop(key, None)
            self._listed.discard(key)
            self._expect.pop(key, None)
            self._list_rv.pop(key, None)
            self._events.pop(key, None)

    def invalidate(self) -> None:
        """Trust nothing about pods until each job's are listed again: after this replica was a standby (its
        watches paused), and periodically, so a deletion a restarted watch never reported cannot linger."""
        with self._lock:
            self._untrust_all()

    def _untrust_all(self) -> None:
        self._listed.clear()
        self._expect.clear()

    def untrust(self, key: Key) -> None:
        """Trust nothing about this job's pods until they are listed again: a delete found its pod gone or replaced,
        so a deletion never reached the store."""
        with self._lock:
            self._listed.discard(key)
            self._expect.pop(key, None)

    def relisted(self, *, every: float = 5.0) -> bool:
        """A watch listed its objects again (after an expired resourceVersion, a 410): it never reports what was
        deleted in the gap, so pods are listed again for every job, once per burst of such events. True when this
        call invalidated."""
        with self._lock:
            now = self._clock()
            if now - self._relisted_at < every:
                return False
            self._relisted_at = now
            self._untrust_all()
            return True

    # -- pods ----------------------------------------------------------------------------------------

    def put_pod(self, key: Key, pod: dict[str, Any]) -> None:
        state = read_pod(pod)
        with self._lock:
            self._events[key] = self._events.get(key, 0) + 1
            pods = self._pods.setdefault(key, {})
            held = pods.get(state.name)
            # resourceVersions grow across objects: a pod of an earlier attempt with the same name never replaces
            # a newer one, and a late event of a pod the last list no longer had does not bring it back
            floor = self._list_rv.get(key, 0) if held is None else held.resource_version
            if state.resource_version > floor:
                pods[state.name] = state
                self._satisfy(key, f"add:{state.name}")
            if state.deleting:
                self._satisfy(key, f"del:{state.uid}")

    def delete_pod(self, key: Key, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self._lock:
            self._events[key] = self._events.get(key, 0) + 1
            pods = self._pods.get(key, {})
            held = pods.get(meta["name"])
            if held is not None and held.uid == meta.get("uid"):
                del pods[meta["name"]]
            self._satisfy(key, f"del:{meta.get('uid')}")

    def events_seen(self, key: Key) -> int:
        """A counter of the job's pod events; read it before a list and hand it to :meth:`replace_pods`."""
        with self._lock:
            return self._events.get(key, 0)

    def replace_pods(self, key: Key, pods: list[dict[str, Any]], *, version: int = 0, events_seen: int = 0) -> None:
        """What a list (at resourceVersion ``version``) returned: from now on the job's pods may be served from
        memory. If pod events were applied while the list was in flight, the list may be older than them: it is
        not stored, and the next pass lists again."""
        with self._lock:
            if self._events.get(key, 0) != events_seen:
                return
            self._pods[key] = {p.name: p for p in map(read_pod, pods)}
            self._list_rv[key] = version
            self._listed.add(key)

    def pods(self, key: Key) -> list[PodState] | None:
        """The job's pods, or None when they must be listed (never listed, or changes still expected)."""
        with self._lock:
            if key not in self._listed:
                return None
            pending = self._expect.get(key)
            if pending is not None:
                if pending[0] and self._clock() < pending[1]:
                    return None
                del self._expect[key]
            return list(self._pods.get(key, {}).values())

    def waiting(self, key: Key) -> float | None:
        """Seconds this job's pass should wait for changes it made that the watch has not delivered yet (each
        delivery starts a pass of its own), or None when nothing is on its way."""
        with self._lock:
            pending = self._expect.get(key)
            if pending is None or not pending[0]:
                return None
            left = pending[1] - self._clock()
            return left if left > 0 else None

    def expect(self, key: Key, *, added: Sequence[str] = (), deleted: Sequence[str] = ()) -> None:
        """This pass created the pods ``added`` (names) and deleted ``deleted`` (uids); changes the watch has
        already delivered are not waited for."""
        with self._lock:
            held = self._pods.get(key, {})
            seen_uids = {p.uid: p for p in held.values()}
            marks = {f"add:{n}" for n in added if n not in held}
            marks |= {f"del:{u}" for u in deleted if u in seen_uids and not seen_uids[u].deleting}
            if not marks:
                return
            pending, _ = self._expect.get(key, (set(), 0.0))
            self._expect[key] = (pending | marks, self._clock() + EXPECTATION_TTL)

    def unexpect(self, key: Key, *, added: Sequence[str]) -> None:
        """Pods :meth:`expect` was told about that were not created after all (the API server refused the gang)."""
        with self._lock:
            for name in added:
                self._satisfy(key, f"add:{name}")

    def _satisfy(self, key: Key, mark: str) -> None:
        pending = self._expect.get(key)
        if pending is not None:
            pending[0].discard(mark)
