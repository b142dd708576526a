"""The watch cache (finetune_operator.store): newer versions win, pods are served only once listed and only while
no change this operator made is still on its way."""

from __future__ import annotations

from typing import Any

import pytest
from finetune_operator.state import PodState
from finetune_operator.store import EXPECTATION_TTL, Store

pytestmark = pytest.mark.unit
KEY = ("ns", "ft")


def job(rv: int, uid: str = "u1", state: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "ft", "uid": uid, "resourceVersion": str(rv)},
        "status": {"state": state},
    }


def pod(name: str, rv: int, uid: str | None = None, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", "resourceVersion": str(rv)}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


def names(pods: list[PodState] | None) -> list[str] | None:
    return None if pods is None else sorted(p.name for p in pods)


def test_a_job_is_replaced_only_by_a_newer_version_and_an_echo_is_not_news() -> None:
    store = Store()
    assert store.put_job(job(5)) is True
    assert store.put_job(job(5)) is False  # the watch echoing what a status write already stored
    assert store.put_job(job(4, state="Pending")) is False  # a late event never rolls back
    assert store.job(KEY)["status"]["state"] == "Running"  # type: ignore[index]
    assert store.put_job(job(9, uid="u2")) is True  # a re-created job of the same name: a new object, newer
    # A list taken before the delete and re-create must not put the dead uid back: versions are one sequence.
    assert store.put_job(job(5, uid="u1")) is False
    assert store.job(KEY)["metadata"]["uid"] == "u2"  # type: ignore[index]
    assert store.newer_than(KEY, 8) and not store.newer_than(KEY, 9)
    store.forget_job(KEY)
    assert store.job(KEY) is None


def test_pods_are_served_only_after_a_list() -> None:
    """A pod the pod watch has not delivered yet must not read as a pod that vanished."""
    store = Store()
    store.put_pod(KEY, pod("ft-node-1", 10))
    assert store.pods(KEY) is None
    store.replace_pods(
        KEY, [pod("ft-node-0", 9), pod("ft-node-1", 10)], version=10, events_seen=store.events_seen(KEY)
    )  # the list started after that event
    assert names(store.pods(KEY)) == ["ft-node-0", "ft-node-1"]
    store.put_pod(KEY, {**pod("ft-node-0", 8), "status": {"phase": "Pending"}})  # older: ignored
    assert {p.phase for p in store.pods(KEY) or []} == {"Running"}
    store.delete_pod(KEY, pod("ft-node-1", 11))
    assert names(store.pods(KEY)) == ["ft-node-0"]
    store.invalidate()
    assert store.pods(KEY) is None


def test_changes_this_operator_made_are_waited_for_then_served() -> None:
    now = [0.0]
    store = Store(clock=lambda: now[0])
    store.replace_pods(KEY, [pod("ft-node-0", 1)])
    store.expect(KEY, added=["ft-node-1"], deleted=["uid-ft-node-0"])
    assert store.waiting(KEY) == pytest.approx(EXPECTATION_TTL)  # the controller skips the pass meanwhile
    assert store.pods(KEY) is None  # neither change delivered yet: a pass that runs anyway lists
    store.put_pod(KEY, pod("ft-node-1", 2))
    assert store.pods(KEY) is None  # the deletion is still on its way
    store.put_pod(KEY, pod("ft-node-0", 3, deleting=True))  # graceful deletion: marked first
    assert store.waiting(KEY) is None
    assert names(store.pods(KEY)) == ["ft-node-0", "ft-node-1"]
    store.expect(KEY, added=["ft-node-2"])
    now[0] += EXPECTATION_TTL + 1  # never delivered: stop waiting
    assert store.waiting(KEY) is None
    assert names(store.pods(KEY)) == ["ft-node-0", "ft-node-1"]


def test_changes_the_watch_delivered_before_the_pass_noted_them_are_not_waited_for() -> None:
    store = Store()
    store.replace_pods(KEY, [])
    store.put_pod(KEY, pod("ft-node-0", 5))  # the ADDED event beat the create call's return
    store.expect(KEY, added=["ft-node-0"])
    assert names(store.pods(KEY)) == ["ft-node-0"]
    store.drop(KEY)
    assert store.pods(KEY) is None and store.job(KEY) is None


def test_pods_expected_but_never_created_are_not_waited_for() -> None:
    """The pass notes the gang's pods before it creates them; when the API server refuses the second, only the first
    is still awaited."""
    store = Store()
    store.replace_pods(KEY, [])
    store.expect(KEY, added=["ft-node-0", "ft-node-1"])
    store.unexpect(KEY, added=["ft-node-1"])
    assert store.waiting(KEY) is not None
    store.put_pod(KEY, pod("ft-node-0", 4))
    assert store.waiting(KEY) is None and names(store.pods(KEY)) == ["ft-node-0"]


def test_a_list_that_raced_pod_events_is_not_trusted() -> None:
    """A pod failed (its event applied) while the list was in flight: the older list must not overwrite it."""
    store = Store()
    seen = store.events_seen(KEY)
    store.put_pod(KEY, {**pod("ft-node-0", 12), "status": {"phase": "Failed"}})  # arrives during the list
    store.replace_pods(KEY, [pod("ft-node-0", 11)], version=11, events_seen=seen)
    assert store.pods(KEY) is None  # the next pass lists again
    seen = store.events_seen(KEY)
    store.replace_pods(KEY, [{**pod("ft-node-0", 12), "status": {"phase": "Failed"}}], version=13, events_seen=seen)
    assert [p.phase for p in store.pods(KEY) or []] == ["Failed"]


def test_a_late_event_of_an_earlier_attempts_pod_does_not_come_back() -> None:
    """Gang restart: attempt k's pod is gone when the pods are listed; its delayed events must not resurrect it,
    nor replace attempt k+1's pod of the same name, nor satisfy the wait for that pod."""
    store = Store()
    store.replace_pods(KEY, [], version=100)
    store.expect(KEY, added=["ft-node-0"])
    store.put_pod(KEY, pod("ft-node-0", 90, uid="old"))  # attempt k, terminating, delivered late
    assert store.waiting(KEY) is not None and store.pods(KEY) is None
    store.put_pod(KEY, pod("ft-node-0", 105, uid="new"))  # attempt k+1
    assert store.waiting(KEY) is None
    store.put_pod(KEY, pod("ft-node-0", 95, uid="old"))
    store.delete_pod(KEY, pod("ft-node-0", 96, uid="old"))  # uid-guarded: the new pod stays
    assert [p.uid for p in store.pods(KEY) or []] == ["new"]


def test_a_relist_burst_or_a_failed_delete_makes_the_jobs_pods_listed_again() -> None:
    """kopf's listing after a 410 never reports deletions in the gap: the first listing event of a burst stops the
    store trusting any job's pods (the rest of the burst does not, so lists are not repeated per event); a delete
    that found its pod gone stops trusting that job's pods."""
    clock = [100.0]
    store = Store(clock=lambda: clock[0])
    other = ("ns", "other")
    for key in (KEY, other):
        store.replace_pods(key, [pod(f"{key[1]}-node-0", 9)], version=9, events_seen=store.events_seen(key))
    assert store.relisted() is True
    assert store.pods(KEY) is None and store.pods(other) is None
    store.replace_pods(KEY, [pod("ft-node-0", 9)], version=9, events_seen=store.events_seen(KEY))
    clock[0] += 1
    assert store.relisted() is False  # the same burst: the list just taken stays trusted
    assert names(store.pods(KEY)) == ["ft-node-0"]
    clock[0] += 10
    assert store.relisted() is True  # a later relist
    store.replace_pods(KEY, [pod("ft-node-0", 9)], version=9, events_seen=store.events_seen(KEY))
    store.replace_pods(other, [pod("other-node-0", 9)], version=9, events_seen=store.events_seen(other))
    store.untrust(KEY)
    assert store.pods(KEY) is None and names(store.pods(other)) == ["other-node-0"]
