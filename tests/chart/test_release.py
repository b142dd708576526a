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
DIGESTS = {name: "sha256:" + str(i) * 64 for i, name in enumerate(release.IMAGES, 1)}


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
    shutil.copytree(CHART, pinned, symlinks=False)  # as `publish` copies it: the CRD link becomes the file
    assert release.pin(pinned, DIGESTS, registry="registry.corp/ml") == []
    assert (pinned / "values.yaml").read_text().count('digest: "sha256:') == 4  # comments and layout kept
    helm.run("lint", "--strict", str(pinned))
    helm.run("package", str(pinned), f"--destination={tmp_path / 'dist'}")
    (tgz,) = (tmp_path / "dist").glob("finetune-operator-*.tgz")
    docs = docs_of(helm.run("template", RELEASE, str(tgz)).stdout)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"registry.corp/ml/operator@{DIGESTS['operator']}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FINETUNE_DEFAULT_IMAGE"] == f"registry.corp/ml/trainer@{DIGESTS['trainer']}"
    assert env["FINETUNE_ORT_IMAGE"] == f"registry.corp/ml/trainer-ort@{DIGESTS['trainer-ort']}"
    runtimes = {d["metadata"]["name"]: d["spec"]["images"] for d in docs if d["kind"] == "ClusterFineTuneRuntime"}
    assert runtimes == {
        "cpu": {"default": f"registry.corp/ml/trainer-cpu@{DIGESTS['trainer-cpu']}", "ort": env["FINETUNE_ORT_IMAGE"]},
        "gpu": {"default": env["FINETUNE_DEFAULT_IMAGE"], "ort": env["FINETUNE_ORT_IMAGE"]},
    }
    assert release.pin(pinned, {"operator": "latest"}) != []  # never a tag in a digest
    assert release.pin(pinned, {"trainer-rocm": DIGESTS["trainer"]}) != []  # no such image in the chart


def test_an_image_not_built_keeps_its_tag_under_the_release_registry(helm: Helm, tmp_path: Path) -> None:
    """The local release builds the operator and the CPU trainer only (the CUDA bases come from registries this
    machine cannot reach): the others are not pinned to a digest nobody pushed."""
    pinned = tmp_path / "finetune-operator"
    shutil.copytree(CHART, pinned, symlinks=False)
    release.set_version(pinned, "0.1.7")
    built = {k: DIGESTS[k] for k in ("operator", "trainer-cpu")}
    assert release.pin(pinned, built, registry="127.0.0.1:5000/finetune-operator") == []
    docs = docs_of(helm.run("template", RELEASE, str(pinned)).stdout)
    deployment = one(docs, "Deployment")
    assert deployment["metadata"]["labels"]["helm.sh/chart"] == "finetune-operator-0.1.7"
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FINETUNE_DEFAULT_IMAGE"] == "127.0.0.1:5000/finetune-operator/trainer:0.1.7"
    assert env["FINETUNE_ORT_IMAGE"] == "127.0.0.1:5000/finetune-operator/trainer-ort:0.1.7"
    cpu = next(d for d in docs if d["kind"] == "ClusterFineTuneRuntime" and d["metadata"]["name"] == "cpu")
    assert cpu["spec"]["images"]["default"] == f"127.0.0.1:5000/finetune-operator/trainer-cpu@{DIGESTS['trainer-cpu']}"


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
    for name in release.IMAGES:  # every image the chart deploys, pinned by the digest its leg pushed
        assert name in legs and f'--{name} "$(cat digests/{name})"' in chart_steps, name
    # the chart job runs what the local release runs (tests/realnodes/test_release.py): publish
    publish = 'python -m hack.release publish --version "${GITHUB_REF_NAME#v}" --registry "$REGISTRY/$OWNER"'
    assert publish in chart_steps
    for job in jobs.values():
        for step in job["steps"]:
            if "uses" in step:
                assert "@" in step["uses"], step  # every action at a fixed version
