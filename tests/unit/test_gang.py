"""Gang scheduling without Kueue as the operator builds it: which scheduler a job gets (its own, its runtime's, the
chart's, or none), the PodGroup of each attempt before its ranks and the previous one deleted, what names it on the
pods, and a refusal that says what to fix. The API server takes the objects in tests/integration/test_gang_objects.py;
the coscheduling scheduler places them in tests/realnodes/test_gang.py."""

from __future__ import annotations

from typing import Any

import pytest
from finetune_operator.builders import JobRef, build_placeholder, build_pod, build_pod_group, pod_group_name
from finetune_operator.gang import GangScheduling, effective
from finetune_operator.reconcile import create_rejected
from finetune_operator.settings import Settings
from finetune_operator.spec import SpecError, parse_spec
from finetune_operator.state import read_job

from tests.unit.factories import NOW, base_spec, decided, job

pytestmark = pytest.mark.unit
REF = JobRef("ft", "ns", "uid-1")
COSCHEDULING = Settings(gang_scheduler="coscheduling")


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ({"scheduler": "yunikorn"}, "spec.gangScheduling.scheduler", "expected coscheduling, volcano or none"),
        ({}, "spec.gangScheduling.scheduler", "expected coscheduling"),
        ({"scheduler": "volcano", "schedulerName": ""}, "spec.gangScheduling.schedulerName", "non-empty"),
        ({"scheduler": "volcano", "queue": "q"}, "spec.gangScheduling.queue", "unknown field"),
    ],
)
def test_a_wrong_gang_scheduler_names_its_field(value: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(base_spec(gangScheduling=value))
    assert says in dict(e.value.errors)[field], e.value.errors


def test_the_jobs_own_scheduler_wins_over_the_charts_and_none_opts_out() -> None:
    assert effective(None, "", "") is None
    assert effective(None, "coscheduling", "") == GangScheduling("coscheduling")
    assert effective(None, "volcano", "vc") == GangScheduling("volcano", "vc")
    assert effective(GangScheduling("none"), "volcano", "vc") is None
    assert effective(GangScheduling("volcano"), "coscheduling", "sp") == GangScheduling("volcano")  # not its name
    assert effective(GangScheduling("coscheduling"), "coscheduling", "sp") == GangScheduling("coscheduling", "sp")


def test_every_rank_names_the_attempts_group_and_goes_to_its_scheduler() -> None:
    spec = parse_spec(base_spec(nodes=3))
    group = pod_group_name(REF, 1)
    for rank in range(3):
        pod = build_pod(REF, spec, rank=rank, attempt=1, settings=COSCHEDULING)
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == group
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    volcano = parse_spec(base_spec(nodes=3, gangScheduling={"scheduler": "volcano", "schedulerName": "vc"}))
    pod = build_pod(REF, volcano, rank=0, attempt=1, settings=COSCHEDULING)
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == group
    assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"] and pod["spec"]["schedulerName"] == "vc"
    own = parse_spec(base_spec(nodes=3, podTemplate={"schedulerName": "mine"}))
    assert build_pod(REF, own, rank=0, attempt=0, settings=COSCHEDULING)["spec"]["schedulerName"] == "mine"
    plain = build_pod(REF, spec, rank=0, attempt=0, settings=Settings())
    assert "schedulerName" not in plain["spec"] and build_pod_group(REF, spec, attempt=0, settings=Settings()) is None


def test_an_elastic_jobs_group_is_its_attempts_size_and_its_placeholders_join_no_group() -> None:
    spec = parse_spec(base_spec(nodes=4, elastic={"minNodes": 2}))
    from finetune_operator import elastic

    group = build_pod_group(REF, elastic.sized(spec, 2), attempt=3, settings=COSCHEDULING)
    assert group is not None and group["spec"] == {"minMember": 2}
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["metadata"]["ownerReferences"][0]["uid"]
    held = build_placeholder(REF, elastic.sized(spec, 2), index=0, count=2, attempt=3, settings=COSCHEDULING)
    assert held["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert "scheduling.x-k8s.io/pod-group" not in held["metadata"]["labels"]


def test_an_attempt_creates_its_group_before_its_ranks_and_deletes_the_previous_one() -> None:
    first = decided(job(nodes=2), settings=COSCHEDULING)
    kinds = [o["kind"] for o in first.create]
    assert kinds.index("PodGroup") < kinds.index("Pod") and kinds.count("Pod") == 2
    assert not first.delete_objects
    restarted = decided(job({"attempt": 2, "state": "Restarting"}, nodes=2), settings=COSCHEDULING)
    (group,) = [o for o in restarted.create if o["kind"] == "PodGroup"]
    assert group["metadata"]["name"] == pod_group_name(REF, 2)
    assert restarted.delete_objects == [("PodGroup.scheduling.x-k8s.io", pod_group_name(REF, 1))]


def test_a_podgroup_the_api_server_refuses_fails_the_job_saying_what_to_fix() -> None:
    plan = create_rejected(
        read_job(job(nodes=2, gangScheduling={"scheduler": "volcano"})),
        [],
        what=f"PodGroup {pod_group_name(REF, 0)}",
        code=403,
        message='podgroups.scheduling.volcano.sh is forbidden: User "op" cannot create resource "podgroups"',
        now=NOW,
        settings=Settings(),
    )
    assert plan.status.state == "Failed" and plan.status.failure is not None
    assert "gangScheduling.scheduler" in plan.status.failure.message and "CRD" in plan.status.failure.message


def test_a_finished_or_suspended_job_deletes_its_group() -> None:
    from tests.unit.factories import STARTED, running

    done = decided(
        job(STARTED, nodes=2),
        [running(0, code=0, phase="Succeeded"), running(1, code=0, phase="Succeeded")],
        settings=COSCHEDULING,
    )
    assert done.status.state == "Succeeded", done.status
    assert ("PodGroup.scheduling.x-k8s.io", pod_group_name(REF, 0)) in done.delete_objects
    held = decided(job(STARTED, nodes=2, suspend=True), [running(0), running(1)], settings=COSCHEDULING)
    assert held.status.state == "Suspended"
    assert ("PodGroup.scheduling.x-k8s.io", pod_group_name(REF, 0)) in held.delete_objects


def test_a_gang_schedulers_name_is_judged_by_the_schedulers_allowlist() -> None:
    from finetune_operator import guardrails

    allowed = Settings(allowed_schedulers=("volcano",))
    spec = parse_spec(base_spec(gangScheduling={"scheduler": "coscheduling", "schedulerName": "rogue"}))
    refused = guardrails.check(REF, spec, allowed)
    assert refused is not None and refused.message.startswith("spec.gangScheduling.schedulerName: rogue is not allowed")
    assert guardrails.check(REF, parse_spec(base_spec(gangScheduling={"scheduler": "volcano"})), allowed) is None


def test_a_job_ending_between_attempts_deletes_the_last_groups_of_the_scheduler_its_runtime_named() -> None:
    """A runtime gave attempt 1 a Volcano group; the gang restarted (attempt 2 not started yet) and the job is then
    suspended, or attempt 2 starts without a gang scheduler: attempt 1's group goes all the same, as Volcano's."""
    restarting = {
        "attempt": 2,
        "state": "Restarting",
        "startTime": "2026-01-01T00:00:00Z",
        "runtime": {"attempt": 1, "template": {"gangScheduling": {"scheduler": "volcano"}}},
    }
    held = decided(job(restarting, nodes=2, suspend=True))
    assert held.status.state == "Suspended", held.status
    volcano = "PodGroup.scheduling.volcano.sh"
    assert (volcano, pod_group_name(REF, 1)) in held.delete_objects, held.delete_objects
    started = decided(job(restarting, nodes=2))
    assert started.status.attempt_start_time is not None and not any(o["kind"] == "PodGroup" for o in started.create)
    assert (volcano, pod_group_name(REF, 1)) in started.delete_objects, started.delete_objects
