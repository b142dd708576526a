"""A real Kueue controller manager against the local control plane (hack/localcluster), for the Kueue test tier.

Built from the Go module proxy by ``build.sh`` (cached under ``$FINETUNE_CACHE/kueue-<version>``), run as a process on
this machine with the plain-pod integration on. Its webhooks are served on 127.0.0.1 and registered with the API server
by URL, with a CA bundle from certificates made here (Kueue's internal certificate management would issue them for a
Service name the API server cannot reach). The configurations come from the same module's manifests, cut down to what
the ``pod`` framework serves: the pod webhooks and Kueue's own resources; the CRDs' conversion webhooks point at the
same server.

Kueue reads its metrics certificate from a fixed path (``/etc/kueue/metrics/certs``); it runs in a mount namespace of
its own where that path is a bind mount of this run's directory, so nothing is written outside it. Its on-demand
visibility API server (an aggregated API, needing its own certificates and an APIService) is off: the tests read the
Workloads and the ClusterQueue's status instead.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from hack.hostproc import HostProcess, https_answers
from hack.localcluster.cluster import _issue_cert, _openssl, free_port

HERE = Path(__file__).resolve().parent
VERSION = (HERE / "version").read_text().strip()
CACHE = Path(os.environ.get("FINETUNE_CACHE", Path.home() / ".cache" / "finetune-operator"))
OUT = CACHE / f"kueue-{VERSION}"
METRICS_CERT_PATH = "/etc/kueue/metrics/certs"  # cmd/kueue/main.go: not configurable
NAMESPACE = "kueue-system"


class KueueError(RuntimeError):
    """Kueue could not be built or started, or it died."""


def ensure_built() -> Path:
    """Build (or reuse) Kueue; returns its output directory (bin/kueue, crds/, webhook/manifests.yaml)."""
    if not (OUT / ".complete").exists():
        subprocess.run(["bash", str(HERE / "build.sh")], check=True)
    return OUT


def _served_by_pod_framework(webhook: dict[str, Any]) -> bool:
    path = webhook["clientConfig"]["service"]["path"]
    return path.endswith("-v1-pod") or "-kueue-x-k8s-io-" in path


def webhook_configurations(
    manifests: str, *, url: str, ca_bundle: str, managed: dict[str, Any]
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, served at ``url``, with ``caBundle``; the pod webhooks scoped by the
    ``managed`` namespace selector (as Kueue's own managedJobsNamespaceSelector), the other frameworks' dropped."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for w in doc["webhooks"]:
            if not _served_by_pod_framework(w):
                continue
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if path.endswith("-v1-pod"):
                w["namespaceSelector"] = managed
            kept.append(w)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def crds(crd_dir: Path, *, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs; those with more than one version convert through Kueue's ``/convert`` webhook at ``url``."""
    out = []
    for f in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if len(crd["spec"]["versions"]) > 1:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def configuration(
    *, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path, managed: dict[str, Any]
) -> dict[str, Any]:
    """Kueue's Configuration for the test tier: the pod integration only, in the namespaces ``managed`` selects."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": managed,
        "integrations": {"frameworks": ["pod"]},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class LocalKueue(HostProcess):
    """One Kueue controller manager for the control plane behind ``kubeconfig``. ``managed_label``: the namespace
    label (key, value) whose namespaces Kueue manages (its pod webhook sees no other namespace)."""

    label = "kueue"
    log_name = "kueue.log"
    error = KueueError

    def __init__(
        self,
        kubeconfig: str,
        *,
        managed_label: tuple[str, str],
        kubectl: str,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__("finetune-kueue-")
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl
        self.managed = {"matchLabels": {managed_label[0]: managed_label[1]}}
        self.health_port = 0
        self.extra_config = extra_config or {}  # more of Kueue's Configuration (MultiKueue's, say)

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args], input=stdin, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise KueueError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _apply(self, objects: list[dict[str, Any]]) -> None:
        self._kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin="\n---\n".join(json.dumps(o) for o in objects),
        )

    def _certificates(self) -> str:
        """A CA and a serving certificate for 127.0.0.1 (webhooks) and the metrics endpoint; returns the CA bundle."""
        pki = self.dir / "pki"
        pki.mkdir()
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=pki)
        _openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=finetune-kueue-ca",
            "-days",
            "30",
            "-out",
            "ca.crt",
            cwd=pki,
        )
        _issue_cert(pki, "serving", "/CN=kueue-webhook", sans="IP:127.0.0.1,DNS:localhost", client=False)
        for d in ("webhook", "metrics"):
            (self.dir / d).mkdir()
            shutil.copy(pki / "serving.crt", self.dir / d / "tls.crt")
            shutil.copy(pki / "serving.key", self.dir / d / "tls.key")
        return base64.b64encode((pki / "ca.crt").read_bytes()).decode()

    def start(self, timeout: float = 120.0) -> LocalKueue:
        out = ensure_built()
        ca_bundle = self._certificates()
        webhook_port, self.health_port, metrics_port = free_port(), free_port(), free_port()
        url = f"https://127.0.0.1:{webhook_port}"
        self._apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
        definitions = crds(out / "crds", url=url, ca_bundle=ca_bundle)
        self._apply(definitions)
        self._kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{c['metadata']['name']}" for c in definitions],
        )
        config = self.dir / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                configuration(
                    webhook_port=webhook_port,
                    health_port=self.health_port,
                    metrics_port=metrics_port,
                    cert_dir=self.dir / "webhook",
                    managed=self.managed,
                )
                | self.extra_config
            )
        )
        # A mount namespace of its own, where Kueue's fixed metrics certificate path is this run's directory.
        script = (
            f"mkdir -p {METRICS_CERT_PATH} && mount --bind {self.dir / 'metrics'} {METRICS_CERT_PATH} && "
            f"exec {out / 'bin' / 'kueue'} --config={config} --zap-log-level=2 "
            "--feature-gates=VisibilityOnDemand=false"
        )
        self.launch(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], self.kubeconfig)
        self.wait_until(lambda: _http_ok(f"http://127.0.0.1:{self.health_port}/readyz"), "Kueue ready", timeout)
        # It answered at all: the server is up (the path is not one it serves).
        self.wait_until(lambda: https_answers(webhook_port, any_status=True), "Kueue's webhook server", timeout)
        self._apply(
            webhook_configurations(
                (out / "webhook" / "manifests.yaml").read_text(), url=url, ca_bundle=ca_bundle, managed=self.managed
            )
        )
        return self

    def stop(self) -> None:
        """Stop Kueue, and remove its webhook configurations first (they fail closed without it)."""
        for kind, name in (
            ("mutatingwebhookconfiguration", "mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "validating-webhook-configuration"),
        ):
            with contextlib.suppress(KueueError):
                self._kubectl("delete", kind, "--ignore-not-found", name)
        super().stop()
