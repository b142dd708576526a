"""Write what each trainer stack's ``TrainingArguments`` accepts into the operator package, so the operator refuses a
bad ``spec.training.extraArgs`` before any pod exists: ``operator/finetune_operator/training_args.json`` (generated,
committed).

    python -m hack.training_args          # rewrite it: introspects the default stack here, the ORT stack's venv
    python -m hack.training_args --check  # exit 1 when it differs from what the stacks' locks install (drift gate)
    python -m hack.training_args --emit default|ort   # print one stack's table (run inside that stack's Python)

Per stack: the transformers version, and for every field of the class the trainer validates ``extraArgs`` against
(``TrainingArguments``; ``ORTTrainingArguments`` on the ONNX Runtime image) its JSON types and, for an enum-typed
field, its values; plus the integrations the image can report to and whether DeepSpeed is installed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "operator" / "finetune_operator" / "training_args.json"


def _json_types(tp: Any) -> tuple[set[str], list[str]]:
    """(JSON types a value of annotation ``tp`` may have, enum values when every non-null choice is an enum, or an
    enum and plain ``str``: ``SchedulerType | str`` accepts the enum's values as strings, and the arguments' own
    ``__post_init__`` converts the string to the enum, refusing any other)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        kinds: set[str] = set()
        values: list[str] = []
        only_enums = True
        args = typing.get_args(tp)
        has_enum = any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args)
        for arg in args:
            k, v = _json_types(arg)
            kinds |= k
            if arg is type(None) or (arg is str and has_enum):
                continue
            if v:
                values += v
            else:
                only_enums = False
        return kinds, (values if only_enums else [])
    if tp is type(None):
        return {"null"}, []
    if tp is bool:
        return {"boolean"}, []
    if tp is int:
        return {"integer"}, []
    if tp is float:
        return {"number"}, []
    if tp is str:
        return {"string"}, []
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"string"}, [str(m.value) for m in tp]
    if origin in (list, tuple, typing.List, typing.Tuple) or tp in (list, tuple):  # noqa: UP006
        return {"array"}, []
    if origin in (dict, typing.Dict) or tp is dict:  # noqa: UP006
        return {"object"}, []
    if typing.get_origin(tp) is typing.Literal:
        return {"string"}, [str(a) for a in typing.get_args(tp)]
    return {"any"}, []


def emit(stack: str) -> dict[str, Any]:
    import importlib.util

    import transformers

    cls: type
    if stack == "ort":
        from optimum.onnxruntime.training_args import ORTTrainingArguments

        cls = ORTTrainingArguments
    else:
        from transformers import TrainingArguments

        cls = TrainingArguments
    fields = _fields(cls)
    if "torch_compile_mode" in fields:  # a plain string for transformers; torch.compile refuses any other mode
        import torch._inductor

        fields["torch_compile_mode"]["enum"] = sorted(torch._inductor.list_mode_options())
    from transformers.integrations import get_available_reporting_integrations

    table = {
        "transformers": transformers.__version__,
        "class": cls.__name__,
        "reportTo": sorted(get_available_reporting_integrations()),
        "deepspeed": importlib.util.find_spec("deepspeed") is not None,
        "fields": fields,
    }
    if stack == "default":  # the TRL trainers' configs add fields of their own (SFT data, DPO, GRPO)
        from trl import DPOConfig, GRPOConfig, SFTConfig

        table["trlFields"] = {
            name: {k: v for k, v in _fields(trl_cls).items() if k not in fields}
            for name, trl_cls in (("sft", SFTConfig), ("dpo", DPOConfig), ("grpo", GRPOConfig))
        }
    return table


def _fields(cls: type) -> dict[str, Any]:
    """Every init field of a TrainingArguments dataclass: its JSON types and, for an enum, its values."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        kinds, values = _json_types(hints.get(f.name, Any))
        choices = (f.metadata or {}).get("choices")
        if not values and choices and kinds <= {"string", "null"}:  # a str field that names its choices (log_level)
            values = [str(c) for c in choices]
        entry: dict[str, Any] = {"type": sorted(kinds)}
        if values:
            entry["enum"] = sorted(set(values))
        fields[f.name] = entry
    return fields


def _ort_python() -> str:
    """The ONNX Runtime venv's Python: ``$FINETUNE_ORT_VENV``, else the one ``.ci/venv.sh`` builds."""
    path = (
        os.environ.get("FINETUNE_ORT_VENV")
        or subprocess.run(
            ["bash", str(ROOT / ".ci" / "venv.sh"), "--ort-path"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return f"{path}/bin/python"


def generate(stacks: tuple[str, ...] = ("default", "ort")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stack in stacks:
        if stack == "default":
            out[stack] = emit(stack)
        else:
            text = subprocess.run(
                [_ort_python(), "-m", "hack.training_args", "--emit", stack],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            out[stack] = json.loads(text)
    return out


def render(tables: dict[str, Any]) -> str:
    return json.dumps(tables, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if "--emit" in argv:
        print(json.dumps(emit(argv[argv.index("--emit") + 1])))
        return 0
    stacks = ("default",) if "--default-only" in argv else ("default", "ort")
    if "--check" in argv:
        held = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
        fresh = generate(stacks)
        drifted = [s for s in stacks if held.get(s) != fresh[s]]
        if drifted:
            print(
                f"{OUT.relative_to(ROOT)}: the {', '.join(drifted)} stack's TrainingArguments changed: "
                "run `make generate`",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.write_text(render(generate(stacks)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
