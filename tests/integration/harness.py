"""Test harness for the operator on the real control plane.

- ``OperatorProcess``: the real operator (``finetune operator``) as a subprocess watching one namespace.
- ``FakeKubelet``: a stand-in for the kubelet, which cannot exist here. It only writes pod *status*
  (phase, container state, exit code, reasons) through the real API, the way a kubelet reports it;
  pods stay unbound, so the API server deletes them at once.
- ``make_job``: a small fluent factory for FineTuneJob manifests.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.operator_process import OperatorProcess  # noqa: F401 - re-exported for the tests
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "finetune.dev", "v1alpha1", "finetunejobs"


def now_ts() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class JobBuilder:
    def __init__(self, name: str) -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FineTuneJob",
            "metadata": {"name": name},
            "spec": {
                "model": {"path": "/models/tiny", "initFromConfig": True},
                "dataset": {"path": "/data/train.jsonl"},
                "output": {"claimName": "out"},
                "training": {"maxSteps": 20, "checkpointEverySteps": 5},
            },
        }

    def set(self, path: str, value: Any) -> JobBuilder:
        node = self.obj["spec"]
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        return self

    def nodes(self, n: int) -> JobBuilder:
        return self.set("nodes", n)

    def max_restarts(self, n: int) -> JobBuilder:
        return self.set("maxRestarts", n)

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)


def make_job(name: str) -> JobBuilder:
    return JobBuilder(name)


class Jobs:
    """FineTuneJob and pod reads for assertions."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.co = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = namespace

    def create(self, job: dict[str, Any]) -> dict[str, Any]:
        return dict(self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, job))

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.co.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.co.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def state(self, name: str) -> str | None:
        return self.status(name).get("state")

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        for c in self.status(name).get("conditions", []):
            if c["type"] == ctype:
                return dict(c)
        return None

    def pods(self, job: str) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"finetune.dev/job-name={job}").items
        return sorted(pods, key=lambda p: p.metadata.name)

    def live_pods(self, job: str) -> list[Any]:
        return [p for p in self.pods(job) if p.metadata.deletion_timestamp is None]

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: self.status(name) if self.state(name) == state else None,
            timeout=timeout,
            what=f"{self.ns}/{name} to reach state {state}",
        )

    def wait_pods(self, job: str, count: int, *, attempt: int | None = None, timeout: float = 60) -> list[Any]:
        def probe() -> list[Any] | None:
            pods = self.live_pods(job)
            if attempt is not None:
                pods = [p for p in pods if p.metadata.labels.get("finetune.dev/attempt") == str(attempt)]
            return pods if len(pods) == count else None

        return wait_for(probe, timeout=timeout, what=f"{count} live pods of {job} (attempt {attempt})")

    def events(self, name: str) -> list[Any]:
        evs = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return [e for e in evs if e.involved_object.kind == "FineTuneJob"]


class FakeKubelet:
    """Writes pod status as a kubelet would (no kubelet or container runtime can run here)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = namespace

    def _patch(self, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": status})

    def _container(self, state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
        return {
            "name": "trainer",
            "ready": ready,
            "restartCount": 0,
            "image": "trainer:test",
            "imageID": "",
            "state": state,
        }

    def run(self, name: str, ip: str = "10.0.0.1") -> None:
        self._patch(
            name,
            {
                "phase": "Running",
                "podIP": ip,
                "startTime": now_ts(),
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [self._container({"running": {"startedAt": now_ts()}}, ready=True)],
            },
        )

    def exit(self, name: str, code: int, *, reason: str | None = None, message: str = "") -> None:
        term: dict[str, Any] = {
            "exitCode": code,
            "startedAt": now_ts(),
            "finishedAt": now_ts(),
            "reason": reason or ("Completed" if code == 0 else "Error"),
        }
        if message:
            term["message"] = message
        self._patch(
            name,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [self._container({"terminated": term}, ready=False)],
            },
        )

    def evict(self, name: str) -> None:
        self._patch(
            name,
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": "The node was low on resource: memory.",
                    }
                ],
            },
        )

    def wait_image_pull(self, name: str) -> None:
        self._patch(
            name,
            {
                "phase": "Pending",
                "containerStatuses": [
                    self._container(
                        {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope"'}},
                        ready=False,
                    )
                ],
            },
        )
