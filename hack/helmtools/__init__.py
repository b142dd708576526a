"""Chart test tools built from the Go module proxy: helm, promtool, controller-gen and the Prometheus Operator CRDs.

``ensure_tools()`` runs ``hack/helmtools/build.sh`` (a no-op when its cache is complete) and returns the tools
directory: ``bin/helm``, ``bin/promtool``, ``bin/controller-gen`` and ``crds/monitoring.coreos.com_*.yaml``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build.sh"


@dataclass(frozen=True)
class Tools:
    root: Path

    @property
    def helm(self) -> str:
        return str(self.root / "bin" / "helm")

    @property
    def promtool(self) -> str:
        return str(self.root / "bin" / "promtool")

    @property
    def controller_gen(self) -> str:
        return str(self.root / "bin" / "controller-gen")

    def monitoring_crds(self) -> list[Path]:
        return sorted((self.root / "crds").glob("monitoring.coreos.com_*.yaml"))


def write_or_check(out: Path, text: str, *, module: str, argv: list[str], root: Path) -> int:
    """The main of a generator: write ``out``, or with ``--check`` exit 1 when it differs from ``text``."""
    import sys

    if "--check" in argv:
        if not out.exists() or out.read_text() != text:
            print(f"{out.relative_to(root)} is stale: run python -m {module}", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out.relative_to(root)}")
    return 0


def tools_dir() -> Path:
    return Path(
        subprocess.run(["bash", str(BUILD), "--path"], check=True, capture_output=True, text=True).stdout.strip()
    )


def ensure_tools() -> Tools:
    """Build (or reuse) the tools; cold this compiles helm, promtool and controller-gen (minutes)."""
    root = tools_dir()
    if not (root / ".complete").exists():
        subprocess.run(["bash", str(BUILD)], check=True)
    return Tools(root)
