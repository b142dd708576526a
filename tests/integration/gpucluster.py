"""Helpers of the scheduling tiers (test_gpu_cluster, test_kueue; their fixtures are in this directory's conftest):
restricted namespaces, claims bound the way the PV controller binds them, the operator as a subprocess, GPU jobs.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from tests.conftest import Cluster
from tests.integration.gpunodes import GPU_TOLERATION
from tests.integration.harness import OperatorProcess, make_job


def make_ns(c: Cluster, level: str = "restricted") -> str:
    ns = f"g-{uuid.uuid4().hex[:6]}"
    c.run_kubectl("create", "namespace", ns)
    c.run_kubectl(
        "label",
        "namespace",
        ns,
        f"pod-security.kubernetes.io/enforce={level}",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    return ns


def bound_claim(api: client.ApiClient, ns: str, name: str = "out", modes: tuple[str, ...] = ("ReadWriteMany",)) -> None:
    """A claim already bound to a PersistentVolume (the scheduler only places pods whose claims are bound). No
    volume plugin or provisioner runs here: the PV names an NFS export nothing ever mounts, and the binding is
    written the way the PV controller writes it (volumeName, bind-completed, status Bound)."""
    core = client.CoreV1Api(api)
    pv = f"pv-{ns}-{name}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv, "labels": {"finetune.dev/test-ns": ns}},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": list(modes),
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "nfs": {"server": "192.0.2.1", "path": f"/{ns}/{name}"},
                "claimRef": {"namespace": ns, "name": name},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {
                "accessModes": list(modes),
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "100Gi"}},
            },
        },
    )
    core.patch_namespaced_persistent_volume_claim_status(
        name, ns, {"status": {"phase": "Bound", "accessModes": list(modes), "capacity": {"storage": "100Gi"}}}
    )


class Operator:
    def __init__(self, c: Cluster, ns: str, **env: str) -> None:
        self.proc = OperatorProcess(c.kubeconfig, ns, **env).start()

    def stop(self, failed: bool) -> None:
        self.proc.stop()
        if failed:
            print("==== operator log (tail) ====\n" + "\n".join(self.proc.output().splitlines()[-80:]))


def gpu_job(name: str, *, nodes: int = 1, gpus: int = 8, tolerate: bool = True) -> Any:
    j = make_job(name).nodes(nodes).set("resources", {"limits": {"nvidia.com/gpu": gpus}})
    if tolerate:
        j.set("podTemplate", {"tolerations": [GPU_TOLERATION]})
    return j
