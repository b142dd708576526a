"""Kubeconfigs that authenticate as a ServiceAccount (a TokenRequest token), for tests that act with a tenant's or the
chart's permissions instead of the admin's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def service_account_kubeconfig(cluster: Any, account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig holding only a one-hour token of ServiceAccount ``namespace/account``, for the test cluster's API
    server (taken from its admin kubeconfig)."""
    token = cluster.run_kubectl("create", "token", account, "-n", namespace, "--duration=1h").strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])["cluster"]
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path
