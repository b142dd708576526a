"""Chart test plumbing: helm/promtool built from the Go module proxy, rendering, value sets, adoption helpers.

Run the chart tier with ``pytest tests/chart`` (or ``-m chart``). Snapshots: ``UPDATE_SNAPSHOTS=1 pytest
tests/chart -k snapshot`` rewrites ``tests/chart/snapshots/``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.helmtools import Tools, ensure_tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "finetune-operator"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
RELEASE = "finetune-operator"
RELEASE_NS = "finetune-system"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chart: the Helm chart tier (helm, promtool; some tests on the control plane)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.chart)


# Value sets rendered, snapshotted and dry-run on the server. Namespaces named "team-a"/"team-b" are replaced by
# real namespaces in the server-side tests.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "monitoring-ha": {
        "replicaCount": 2,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "finetune-operator"}},
            }
        ],
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        },
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "alertLabels": {"team": "ml-platform"},
        },
        # a PodMonitor needs Prometheus admitted on the trainers' metrics port
        "trainerNetworkPolicy": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        },
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Training"}},
        "gangScheduling": {"scheduler": "coscheduling", "schedulerName": "default-scheduler"},
    },
    "namespaced": {
        "rbac": {"scope": "namespaced", "watchNamespaces": ["team-a", "team-b"]},
        "metrics": {"podMonitor": {"enabled": True}},
        "trainerNetworkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},  # every namespace, as the field says
        "trainer": {
            "image": {"repository": "registry.example.com/ml/trainer", "tag": "1.2.3", "pullPolicy": "Always"},
            "ortImage": {"repository": "registry.example.com/ml/trainer-ort", "tag": "1.2.3-ort"},
        },
        "guardrails": {
            "allowedImagePrefixes": ["registry.example.com/ml/"],
            "allowedPriorityClasses": ["train-low"],
            "allowedTolerationKeys": ["spot", "nvidia.com/gpu"],
            "allowedSchedulers": ["volcano"],
            "maxNodesPerJob": 16,
            "maxGpusPerJob": 128,
        },
        "gangScheduling": {"scheduler": "volcano"},
    },
    "standalone-minimal": {
        "peering": {"enabled": False},
        "crds": {"enabled": False},
        "metrics": {"enabled": False},
        "health": {"port": 0},
        "rbac": {"aggregateToDefaultRoles": False},
        "operator": {
            "logJSON": False,
            "verbose": True,
            "extraArgs": ["--namespace=ignored-by-env"],
            "extraEnv": [{"name": "FINETUNE_RESYNC_SECONDS", "value": "60"}],
        },
    },
    "long-names-keepless": {
        "fullnameOverride": "a-very-long-release-name-for-finetune-operator-that-exceeds-sixty-three-characters",
        "image": {"repository": "registry.example.com/finetune/operator", "digest": "sha256:" + "ab" * 32},
        "crds": {"keep": False},
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "ml"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "hardened-openshift": {
        "replicaCount": 2,
        "revisionHistoryLimit": 3,
        "commonLabels": {"example.com/cost-center": "ml-42"},
        "commonAnnotations": {"example.com/owner": "platform-team"},
        "podDisruptionBudget": {"enabled": True},
        "openshift": {"enabled": True},
        "rbac": {"admissionPolicy": {"enabled": True}, "tenantGuard": {"enabled": True}},
        "trainer": {
            "nodeSelector": {"pool": "gpu"},
            "priorityClassName": "training",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "imagePullSecrets": ["registry-cred"],
        },
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        },
        "trainerNetworkPolicy": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        },
        "metrics": {
            "serviceMonitor": {
                "enabled": True,
                "relabelings": [{"targetLabel": "cluster", "replacement": "gpu-west", "action": "replace"}],
            },
            "podMonitor": {
                "enabled": True,
                "metricRelabelings": [
                    {
                        "sourceLabels": ["__name__"],
                        "regex": "finetune_train_step_duration_seconds_bucket",
                        "action": "drop",
                    }
                ],
            },
            "service": {"annotations": {"example.com/scrape": "yes"}},
        },
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
        "kueue": {"enabled": True},
    },
}


class Helm:
    def __init__(self, tools: Tools, home: Path) -> None:
        self.tools = tools
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self.env.pop("KUBECONFIG", None)

    def run(
        self, *args: str, kubeconfig: str | None = None, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.tools.helm, *args]
        if kubeconfig:
            cmd.append(f"--kubeconfig={kubeconfig}")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def template(
        self,
        values: dict[str, Any] | None = None,
        *,
        release: str = RELEASE,
        namespace: str = RELEASE_NS,
        extra: tuple[str, ...] = (),
        check: bool = True,
        tmp: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(CHART), f"--namespace={namespace}", *extra]
        if values:
            vf = (tmp or Path(self.env["HELM_CACHE_HOME"]).parent) / f"values-{abs(hash(repr(values)))}.yaml"
            vf.parent.mkdir(parents=True, exist_ok=True)
            vf.write_text(yaml.safe_dump(values))
            args.append(f"--values={vf}")
        return self.run(*args, check=check)

    def render(self, values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
        return docs_of(self.template(values, **kw).stdout)


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `5e-05` (no dot) is a string; Helm's toYaml writes floats that way and the API
    server (YAML 1.2) reads them as numbers. Read them as the server does."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+][0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=Yaml12Loader) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


@pytest.fixture(scope="session")
def tools() -> Tools:
    return ensure_tools()


@pytest.fixture(scope="session")
def helm(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tools, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def monitoring_crds(cluster: Any, tools: Tools) -> Iterator[None]:
    """The Prometheus Operator CRDs generated by controller-gen, applied server-side (they are too large for
    client-side apply)."""
    files = tools.monitoring_crds()
    assert files, f"no monitoring CRDs under {tools.root / 'crds'}"
    for f in files:
        cluster.run_kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=finetune-chart-tests", "-f", str(f)
        )
    cluster.run_kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"-f={f}" for f in files])
    yield


CLUSTER_SCOPED_SHARED = tuple(
    f"customresourcedefinition/{plural}.finetune.dev"
    for plural in ("finetunejobs", "clusterfinetuneruntimes", "finetuneruntimes")
)


def adopt_shared(cluster: Any, release: str, namespace: str) -> None:
    """Hand the CRDs that a previous release (kept by crds.keep) or `kubectl apply` left behind to
    ``release``, as a user adopting an existing CRD would (docs/install.md): Helm takes over objects that carry its
    ownership label and annotations."""
    for ref in CLUSTER_SCOPED_SHARED:
        if not cluster.run_kubectl("get", ref, "--ignore-not-found", "-o", "name").strip():
            continue
        cluster.run_kubectl("label", "--overwrite", ref, "app.kubernetes.io/managed-by=Helm")
        cluster.run_kubectl(
            "annotate",
            "--overwrite",
            ref,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )


def ensure_kopf_crds(cluster: Any) -> None:
    """kopf's peering CRDs exist for real (server-side dry-runs of KopfPeering objects need them)."""
    f = CHART / "crds" / "kopf-peering-crds.yaml"
    cluster.run_kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=finetune-chart-tests", "-f", str(f)
    )
    cluster.run_kubectl("wait", "--for=condition=Established", "--timeout=60s", f"-f={f}")
