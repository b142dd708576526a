"""Gang schedulers for the placement tests: the scheduler-plugins kube-scheduler with the Coscheduling plugin, run as a
second scheduler against a local control plane, and the PodGroup CRDs of it and of Volcano.

Built from the Go module proxy by ``build.sh`` (cached under ``$FINETUNE_CACHE/gangschedulers-<versions>``). The
scheduler runs as a process on this machine with one profile, ``scheduler-plugins-scheduler`` (the name the operator
gives pods by default with ``coscheduling``): the Coscheduling plugin everywhere it plugs in (queue sort, pre-filter,
post-filter, permit, reserve), as the module's own ``manifests/coscheduling/scheduler-config.yaml``. Pods naming
another scheduler are left to the control plane's own kube-scheduler. Volcano's scheduler module is not served by the
Go module proxy: only its PodGroup CRD (generated from ``volcano.sh/apis``) is installed, to check the operator's
objects against it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from hack.hostproc import HostProcess, https_answers
from hack.localcluster.cluster import free_port

HERE = Path(__file__).resolve().parent
SCHEDULER_NAME = "scheduler-plugins-scheduler"
PERMIT_WAITING_SECONDS = 10  # how long the plugin holds a gang's first ranks at Permit for the rest


class SchedulerError(RuntimeError):
    """The scheduler could not be built or started, or it died."""


def ensure_built() -> Path:
    """Build (or reuse) the pieces; returns the output directory (bin/kube-scheduler, crds/)."""
    where = subprocess.run(["bash", str(HERE / "build.sh"), "--path"], capture_output=True, text=True, check=True)
    out = Path(where.stdout.strip())
    if not (out / ".complete").exists():
        subprocess.run(["bash", str(HERE / "build.sh")], check=True)
    return out


def crd(name: str) -> dict[str, Any]:
    """A PodGroup CRD: ``scheduling.x-k8s.io_podgroups`` (coscheduling) or ``scheduling.volcano.sh_podgroups``."""
    return dict(yaml.safe_load((ensure_built() / "crds" / f"{name}.yaml").read_text()))


def configuration(kubeconfig: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": kubeconfig},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                },
                "pluginConfig": [
                    {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": PERMIT_WAITING_SECONDS}}
                ],
            }
        ],
    }


class LocalCoscheduling(HostProcess):
    """The Coscheduling scheduler for the control plane behind ``kubeconfig`` (an admin's)."""

    label = "the scheduler"
    log_name = "scheduler.log"
    error = SchedulerError

    def __init__(self, kubeconfig: str) -> None:
        super().__init__("finetune-coscheduling-")
        self.kubeconfig = kubeconfig

    def start(self, timeout: float = 60.0) -> LocalCoscheduling:
        out = ensure_built()
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(configuration(self.kubeconfig)))
        port = free_port()
        self.launch(
            [
                str(out / "bin" / "kube-scheduler"),
                f"--config={config}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--v=2",
            ],
            self.kubeconfig,
        )
        self.wait_until(lambda: https_answers(port), "the scheduler's health endpoint", timeout)
        return self
