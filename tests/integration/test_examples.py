"""Every manifest in examples/ is accepted by the real API server (CRD schema, CEL) and by the typed spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from finetune_operator.spec import check_name, parse_spec

pytestmark = pytest.mark.integration
EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_validates_against_crd_and_typed_spec(cluster, namespace, path) -> None:  # type: ignore[no-untyped-def]
    manifest = yaml.safe_load(path.read_text())
    check_name(manifest["metadata"]["name"])
    parse_spec(manifest["spec"])
    out = cluster.run_kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert "created (server dry run)" in out
