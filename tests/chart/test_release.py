"""The release path, as far as it runs without a registry: versions agree, the chart is pinned by digest and packaged
(`helm package` of a pinned copy, then rendered), and the workflow builds every image and pushes the pinned chart.
The pushes themselves (docker, `helm push`) need a registry and GitHub's runners; the Dockerfiles are linted by
hadolint in the trainer and chart tiers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import release
from tests.chart.conftest import CHART, RELEASE, ROOT, Helm, docs_of, one

pytestmark = pytest.mark.unit

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
DIGESTS = {"operator": "sha256:" + "1" * 64, "trainer": "sha256:" + "2" * 64, "trainer_ort": "sha256:" + "3" * 64}


def test_every_version_in_the_repository_is_the_charts() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"]
    assert release.check(f"v{chart['version']}") == []


def test_a_tag_that_disagrees_is_refused_naming_every_place(tmp_path: Path) -> None:
    for rel in (
        "charts/finetune-operator/Chart.yaml",
        "pyproject.toml",
        "trainer-image/pyproject.toml",
        "operator/finetune_operator/settings.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    problems = release.check("v9.9.9", root=tmp_path)
    assert len(problems) == 6 and all(p.endswith("the tag says 9.9.9") for p in problems)


def test_the_released_chart_runs_exactly_the_images_built_with_it(helm: Helm, tmp_path: Path) -> None:
    pinned = tmp_path / "finetune-operator"
    shutil.copytree(CHART, pinned, symlinks=False)  # as the workflow's `cp -rL`: the CRD link becomes the file
    assert release.pin(pinned, **DIGESTS) == []
    assert (pinned / "values.yaml").read_text().count('digest: "sha256:') == 3  # comments and layout kept
    helm.run("lint", "--strict", str(pinned))
    helm.run("package", str(pinned), f"--destination={tmp_path / 'dist'}")
    (tgz,) = (tmp_path / "dist").glob("finetune-operator-*.tgz")
    docs = docs_of(helm.run("template", RELEASE, str(tgz)).stdout)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/finetune-operator/operator@{DIGESTS['operator']}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FINETUNE_DEFAULT_IMAGE"] == f"ghcr.io/finetune-operator/trainer@{DIGESTS['trainer']}"
    assert env["FINETUNE_ORT_IMAGE"] == f"ghcr.io/finetune-operator/trainer-ort@{DIGESTS['trainer_ort']}"
    assert release.pin(pinned, operator="latest", trainer="x", trainer_ort="y") != []  # never a tag in a digest


def _workflow() -> dict[Any, Any]:
    wf = yaml.safe_load(WORKFLOW.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return dict(wf)


def test_the_workflow_builds_every_image_and_pushes_the_pinned_chart() -> None:
    wf = _workflow()
    assert wf["on"] == {"push": {"tags": ["v*.*.*"]}}
    assert wf["permissions"] == {"contents": "read"}  # write only where a job pushes
    jobs = wf["jobs"]
    assert jobs["images"]["needs"] == "check" and jobs["chart"]["needs"] == "images"
    assert any("hack.release check" in s.get("run", "") for s in jobs["check"]["steps"])
    legs = {leg["name"]: leg for leg in jobs["images"]["strategy"]["matrix"]["include"]}
    dockerfiles = {
        str(p.relative_to(ROOT))
        for p in [ROOT / "operator" / "Dockerfile", *(ROOT / "trainer-image").glob("Dockerfile*")]
    }
    assert {leg["dockerfile"] for leg in legs.values()} == dockerfiles  # every image the repository defines
    for leg in legs.values():
        # the context each Dockerfile's COPY lines expect (the operator's copies from the repository root)
        assert leg["context"] == ("." if leg["dockerfile"].startswith("operator/") else "trainer-image"), leg
    assert "linux/arm64" in legs["operator"]["platforms"]
    assert jobs["images"]["permissions"]["packages"] == "write"
    chart_steps = "\n".join(s.get("run", "") for s in jobs["chart"]["steps"])
    for name in ("operator", "trainer", "trainer-ort"):
        assert f"digests/{name}" in chart_steps
    assert "python -m hack.release pin" in chart_steps and "cp -rL charts/finetune-operator" in chart_steps
    assert 'helm push "$RUNNER_TEMP/dist/finetune-operator-${GITHUB_REF_NAME#v}.tgz" "oci://' in chart_steps
    for job in jobs.values():
        for step in job["steps"]:
            if "uses" in step:
                assert "@" in step["uses"], step  # every action at a fixed version
