"""What is inside the images built from the repository's Dockerfiles (``hack/images/build.sh``), read by running them
as pods on the real nodes, in a namespace that enforces the restricted Pod Security Standard:
- the entrypoint: a pod that gives only ``args`` runs the image's ENTRYPOINT (``finetune``, ``finetune-trainer``);
- a numeric non-root user: the pods set ``runAsNonRoot`` and no ``runAsUser``, so the kubelet starts them only if
  the image's USER is a number other than 0 (it refuses a name it cannot verify);
- the trainer's ``/opt/finetune/samples`` (what ``examples/quickstart.yaml`` names), and installed versions equal to
  the locks (the trainer's whole lock; the operator's runtime subset of ``requirements.lock``, no dev tools)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.realnodes.conftest import RealCluster, wait_pod_phase

pytestmark = pytest.mark.realnodes
ROOT = Path(__file__).resolve().parents[2]
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "readOnlyRootFilesystem": True,
}
VERSIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def run_pods(rc: RealCluster, namespace: str, pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Run one pod per entry (image, command or args) at once; return each one's log once it has Succeeded."""
    for name, c in pods.items():
        container = {
            "name": "main",
            "image": c["image"],
            "imagePullPolicy": "Never",
            "securityContext": RESTRICTED,
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            **{k: c[k] for k in ("command", "args") if k in c},
        }
        rc.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [container],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                }
            ),
        )
    logs = {}
    for name in pods:
        phase = wait_pod_phase(rc, namespace, name, ("Succeeded", "Failed"))
        logs[name] = rc.kubectl("logs", "-n", namespace, name)
        assert phase == "Succeeded", (name, logs[name], rc.kubectl("describe", "pod", name, "-n", namespace))
    return logs


def lock(path: Path, python: str) -> dict[str, str]:
    """The lock's pins whose environment markers hold for the image (``; sys_platform == 'win32'`` pins do not)."""
    from packaging.markers import Marker

    env = {
        "python_version": python.rsplit(".", 1)[0],
        "python_full_version": python,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)(?:[ \t]*;[ \t]*([^\n\\]+))?", path.read_text(), flags=re.M)
    return {
        norm(name): version
        for name, version, marker in pins
        if not marker.strip() or Marker(marker.strip()).evaluate(env)
    }


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_images_run_their_entrypoints_as_numeric_non_root_users_with_the_locked_stacks(
    real_cluster: RealCluster, namespace: str
) -> None:
    img = real_cluster.images
    probe = f"id -u; python -c 'import platform; print(platform.python_version())'; python -c \"{VERSIONS}\""
    samples = "; ls /opt/finetune/samples/; cat /opt/finetune/samples/tiny-bert/config.json"
    logs = run_pods(
        real_cluster,
        namespace,
        {
            "trainer-entrypoint": {"image": img["trainer"], "args": ["--help"]},
            "operator-entrypoint": {"image": img["operator"], "args": ["--help"]},
            "trainer-inside": {"image": img["trainer"], "command": ["sh", "-c", probe + samples]},
            "operator-inside": {"image": img["operator"], "command": ["sh", "-c", probe]},
        },
    )
    assert "usage: finetune-trainer" in logs["trainer-entrypoint"]
    assert "usage: finetune" in logs["operator-entrypoint"]

    for kind, uid in (("trainer", "10001"), ("operator", "65532")):
        lines = logs[f"{kind}-inside"].splitlines()
        assert lines[0] == uid, (kind, lines[:3])
        python, have = lines[1], {norm(k): v for k, v in json.loads(lines[2]).items()}
        if kind == "trainer":
            want = lock(ROOT / "trainer-image" / "requirements.lock", python)
            wrong = {n: (v, have.get(n)) for n, v in want.items() if have.get(n) != v}
            assert want and not wrong, f"trainer lock vs image: {wrong}"
            assert "finetune-trainer" in have
            extra = set(have) - set(want) - {"finetune-trainer"}
            assert not extra, f"installed in the trainer image but not in its lock: {sorted(extra)}"
            rest = lines[3:]
            quickstart = (ROOT / "examples" / "quickstart.yaml").read_text()
            for sample in re.findall(r"/opt/finetune/samples/([\w-]+)", quickstart):
                assert sample in rest, (sample, rest)
            assert "model_type" in "\n".join(rest)
        else:
            want = lock(ROOT / "requirements.lock", python)
            wrong = {n: (want[n], v) for n, v in have.items() if n in want and want[n] != v}
            assert not wrong, f"operator lock vs image: {wrong}"
            for runtime in ("kopf", "kubernetes", "prometheus-client", "pyyaml", "rich", "finetune-operator"):
                assert runtime in have, runtime
            for dev_tool in ("pytest", "ruff", "mypy", "torch"):
                assert dev_tool not in have, f"{dev_tool} must not be in the operator image"
