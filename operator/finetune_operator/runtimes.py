"""Pure: runtimes, what a platform team sets once for many FineTuneJobs, and the one rule that merges a runtime into
a job. No I/O here: the controller (and ``finetune validate``) read the runtime objects, these functions decide.

A runtime (``ClusterFineTuneRuntime``, cluster-scoped, or ``FineTuneRuntime``, in one namespace) holds:

- ``images``: the trainer images, per stack (``default``: every acceleration but ort; ``ort``);
- ``template``: FineTuneJob spec fields in the job's own shape (pod defaults, resources, env, network, the output
  claim template, queueName, topology, gangScheduling, the shared cache, training defaults): **a field the job sets
  wins**, maps merge key by key (the job's key wins), env, volumes and pull secrets merge by name (the job's entry
  wins), tolerations add up;
- ``guardrails``: limits on what a job may ask for. **They always apply**, on top of the operator's own (Helm
  ``guardrails``): a job must pass both.

A job names its runtime in ``spec.runtimeRef``; without one, its namespace's default runtime (a FineTuneRuntime with
the annotation ``finetune.dev/is-default-runtime: "true"``), else the cluster's default, else none (the operator's
Helm values alone, as before runtimes existed). Several defaults of one kind: the newest wins, as for StorageClasses.

What an attempt was admitted with is recorded in its status (runtime, generation, every effective value and its
source), and the attempt's pods are built from it once: editing or deleting the runtime never touches a running
attempt; the next attempt reads the runtime again. The guide: docs/runtimes.md.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from finetune_operator.settings import Settings
from finetune_operator.spec import JobSpec, RuntimeRef, SpecError, parse_spec

CLUSTER_KIND = "ClusterFineTuneRuntime"
NAMESPACED_KIND = "FineTuneRuntime"
PLURALS = {CLUSTER_KIND: "clusterfinetuneruntimes", NAMESPACED_KIND: "finetuneruntimes"}
DEFAULT_ANNOTATION = "finetune.dev/is-default-runtime"

# The template's fields and how each merges with the job's: the single table of the precedence rule.
MAPS = (
    "podTemplate.labels",
    "podTemplate.annotations",
    "podTemplate.nodeSelector",
    "resources.limits",
    "resources.requests",
)
BY_NAME = ("env", "podTemplate.volumes", "podTemplate.imagePullSecrets")
ADDED = ("podTemplate.tolerations",)
WHOLE = (
    "podTemplate.affinity",
    "podTemplate.priorityClassName",
    "podTemplate.schedulerName",
    "network",
    "queueName",
    "topology",
    "gangScheduling",
    "cache",
    "shmSize",
    "output.volumeClaimTemplate",
    "training.precision",
    "training.activationCheckpointing",
    "training.checkpointEverySteps",
    "training.keepCheckpoints",
)
TEMPLATE_FIELDS = (*MAPS, *BY_NAME, *ADDED, *WHOLE)
# The most a runtime's template may hold, as compact JSON: each attempt copies it into the job's status, and a job's
# object (spec and status) must stay far under etcd's 1.5 MiB request limit for every status write to succeed.
MAX_TEMPLATE_BYTES = 64 * 1024
# The training settings a runtime may give, kept at their first attempt's values (status.runtime.training): the job's
# own spec.training is immutable, and a run resumed in another precision or checkpoint cadence is not the run admitted.
PINNED = tuple(path for path in WHOLE if path.startswith("training."))

# The guardrails a runtime may set: the Helm value (guardrails.<name>) and the Settings field of each.
GUARDRAILS = {
    "allowedImagePrefixes": "allowed_image_prefixes",
    "allowedPriorityClasses": "allowed_priority_classes",
    "allowTrustRemoteCode": "allow_trust_remote_code",
    "requireQueueName": "require_queue_name",
    "allowedServiceAccounts": "allowed_service_accounts",
    "allowedTolerationKeys": "allowed_toleration_keys",
    "allowedSchedulers": "allowed_schedulers",
    "maxNodesPerJob": "max_nodes_per_job",
    "maxGpusPerJob": "max_gpus_per_job",
}
# With every guardrail off: the layer a runtime's guardrails are checked in (the operator's are checked on their own).
NO_GUARDRAILS: dict[str, Any] = {attr: getattr(Settings, attr) for attr in GUARDRAILS.values()}


@dataclass(frozen=True)
class Runtime:
    """A runtime object as read (its spec kept raw: the CRD's schema typed it)."""

    kind: str
    name: str
    namespace: str | None = None
    generation: int = 1
    uid: str = ""
    created: str = ""  # creationTimestamp, for the newest-default rule
    default: bool = False
    description: str = ""
    images: dict[str, str] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)
    guardrails: dict[str, Any] = field(default_factory=dict)
    allowed_namespaces: tuple[str, ...] = ()  # a ClusterFineTuneRuntime's: the namespaces whose jobs may use it

    def allows(self, namespace: str) -> bool:
        return not self.allowed_namespaces or namespace in self.allowed_namespaces

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name} (generation {self.generation})"

    def snapshot(self) -> dict[str, Any]:
        """``status.runtime``: which runtime, at which generation, an attempt was admitted with."""
        return {"kind": self.kind, "name": self.name, "generation": self.generation, "uid": self.uid}


def read_runtime(obj: dict[str, Any]) -> Runtime:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    return Runtime(
        kind=str(obj.get("kind") or (NAMESPACED_KIND if meta.get("namespace") else CLUSTER_KIND)),
        name=str(meta.get("name", "")),
        namespace=meta.get("namespace"),
        generation=int(meta.get("generation") or 1),
        uid=str(meta.get("uid", "")),
        created=str(meta.get("creationTimestamp", "")),
        default=str((meta.get("annotations") or {}).get(DEFAULT_ANNOTATION, "")).lower() == "true",
        description=str(spec.get("description", "")),
        images={k: str(v) for k, v in (spec.get("images") or {}).items() if v},
        template=dict(spec.get("template") or {}),
        guardrails=dict(spec.get("guardrails") or {}),
        allowed_namespaces=tuple(spec.get("allowedNamespaces") or ()),
    )


# -- which runtime ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The runtime a job runs with, how it was chosen, or why it cannot run."""

    runtime: Runtime | None
    how: str  # spec.runtimeRef | the namespace's default | the cluster's default | none
    error: str | None = None
    absent: tuple[str, str] | None = None  # (kind, name) of the named runtime that does not exist
    # The cluster's default when a namespace's runtime is chosen: its guardrails still bind (a namespace's admins may
    # narrow the platform's limits, never drop them by making a default of their own).
    floor: Runtime | None = None


def not_found(ref: RuntimeRef, namespace: str) -> str:
    where = f"in namespace {namespace}" if ref.kind == NAMESPACED_KIND else "in the cluster"
    return (
        f"spec.runtimeRef: {ref.kind} {ref.name!r} does not exist {where}; name one that does (`finetune runtimes` "
        "lists them) or remove spec.runtimeRef for the default"
    )


def choose(
    ref: RuntimeRef | None,
    namespace: str,
    *,
    named: dict[str, Any] | None = None,
    namespaced: Sequence[dict[str, Any]] = (),
    cluster: Sequence[dict[str, Any]] = (),
) -> Choice:
    """``named``: the object ``ref`` names (None: it does not exist); else the defaults among the listed runtimes.
    ``cluster`` also gives the floor of a namespace's runtime (:attr:`Choice.floor`)."""
    cluster_default = _default(cluster, namespace)
    if ref is not None:
        if named is None:
            return Choice(None, "spec.runtimeRef", not_found(ref, namespace), absent=(ref.kind, ref.name))
        chosen = read_runtime(named)
        if not chosen.allows(namespace):
            return Choice(
                None,
                "spec.runtimeRef",
                f"spec.runtimeRef: {chosen.kind} {chosen.name!r} is not for namespace {namespace} (its "
                f"spec.allowedNamespaces: {', '.join(chosen.allowed_namespaces)}); `finetune runtimes` lists those "
                "this namespace may name",
            )
        floor = cluster_default[0] if cluster_default and chosen.kind == NAMESPACED_KIND else None
        return Choice(chosen, "spec.runtimeRef", floor=floor)
    if (mine := _default(namespaced, namespace)) is not None:
        floor = cluster_default[0] if cluster_default else None
        return Choice(mine[0], "the namespace's default" + mine[1], floor=floor)
    if cluster_default is not None:
        return Choice(cluster_default[0], "the cluster's default" + cluster_default[1])
    return Choice(None, "none")


def _default(listed: Sequence[dict[str, Any]], namespace: str) -> tuple[Runtime, str] | None:
    """The default runtime among ``listed`` for ``namespace`` (the newest of several) and a note saying so."""
    defaults = [r for r in map(read_runtime, listed) if r.default and r.allows(namespace)]
    if not defaults:
        return None
    note = f" (newest of {len(defaults)} defaults)" if len(defaults) > 1 else ""
    return max(defaults, key=lambda r: (r.created, r.name)), note


def gone_since_last(record: dict[str, Any] | None, choice: Choice) -> str | None:
    """Why the next attempt should wait rather than start: the runtime the previous attempt ran with (``record``,
    status.runtime) is gone, the one the job names or the default it had (an attempt without it would silently run
    without its images, resources and limits). None: start, with ``choice``."""
    if not record or not record.get("name"):
        return None
    if choice.error is not None and choice.absent == (record.get("kind"), record["name"]):
        return choice.error
    was = f"{record.get('kind')} {record['name']!r}"
    if choice.runtime is None and choice.error is None and "default" in str(record.get("chosenBy")):
        return f"the default runtime the previous attempt ran with, {was}, is gone and no other default exists"
    return None


# -- the merge --------------------------------------------------------------------------------------------------


def _at(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _put(d: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value


def _merged(path: str, mine: Any, theirs: Any) -> Any:
    """The job's value (``mine``) over the runtime's (``theirs``) for one template field."""
    if path in MAPS:
        return {**theirs, **mine}
    if path in BY_NAME:
        names = {item.get("name") for item in mine if isinstance(item, dict)}
        return [*(i for i in theirs if not (isinstance(i, dict) and i.get("name") in names)), *mine]
    if path in ADDED:
        return [*theirs, *(t for t in mine if t not in theirs)]
    return mine


def _present(raw: dict[str, Any], path: str) -> bool:
    value = _at(raw, path)
    if path == "output.volumeClaimTemplate":  # the job's own claim, existing or templated, is its output
        return value is not None or _at(raw, "output.claimName") is not None
    return value not in (None, {}, [])


def _resources_left(raw: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The template with the resources the job names in either of its maps left out of both: a job that sets
    ``limits.memory`` takes no ``requests.memory`` from its runtime (it could be above the job's limit)."""
    mine = set()
    for section in ("limits", "requests"):
        mine |= set(_at(raw, f"resources.{section}") or {})
    if not mine or not isinstance(template.get("resources"), dict):
        return template
    out = dict(template)
    out["resources"] = {
        section: {k: v for k, v in (values or {}).items() if k not in mine}
        for section, values in template["resources"].items()
    }
    return out


def merge(raw: dict[str, Any], template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The job's raw spec with the template's fields filled in (the precedence rule above), and for each template
    field that has a value, where it came from: ``job``, ``runtime`` or ``job + runtime``."""
    template = _resources_left(raw, template)
    out, sources = copy.deepcopy(raw), {}
    for path in TEMPLATE_FIELDS:
        mine, theirs = _present(raw, path), _present(template, path)
        if theirs and not mine:
            _put(out, path, copy.deepcopy(_at(template, path)))
            sources[path] = "runtime"
        elif theirs and mine and path not in WHOLE:
            _put(out, path, _merged(path, _at(raw, path), copy.deepcopy(_at(template, path))))
            sources[path] = "job + runtime"
        elif mine:
            sources[path] = "job"
    return out, sources


# -- the effective job ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """One effective value, as ``finetune validate`` and ``finetune status`` show it; ``source``: ``job``, ``runtime:
    <its field>`` (the runtime is named once, beside), ``job + runtime: spec.template`` or ``Helm value <name>``."""

    field: str
    value: str
    source: str

    def to_wire(self) -> dict[str, str]:
        return {"field": self.field, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class Effective:
    """What an attempt runs with: the merged spec, the operator's settings with the runtime's images, the runtime's
    guardrails as their own layer, and every effective value with its source."""

    spec: JobSpec
    settings: Settings
    guardrails: Settings | None  # the runtime's guardrails alone; None: the runtime sets none
    runtime: Runtime | None
    how: str
    values: tuple[Value, ...]  # the image's first
    floor: Runtime | None = None  # the cluster's default under a namespace's runtime (Choice.floor)
    pinned: dict[str, Any] = field(default_factory=dict)  # PINNED: the runtime's value at the first attempt, or None
    template: dict[str, Any] = field(default_factory=dict)  # the template as merged: the runtime's, training pinned

    @property
    def image_source(self) -> str:
        """Where the image comes from, the runtime named in full (for the guardrails' messages)."""
        source = self.values[0].source
        return source.replace("runtime:", f"{self.runtime.label}:") if self.runtime else source

    @property
    def guardrails_origin(self) -> str:
        """Where the runtime's guardrails are set, a format string taking a guardrail's name (guardrails.check)."""
        return f"{self.runtime.label}: spec.guardrails.{{}}" if self.runtime else ""

    def layers(self) -> list[tuple[Settings, str, bool]]:
        """The runtimes' guardrail layers a job must pass beside the operator's: (the layer, where it is set, whether
        it judges the runtime's own values as the job's). The chosen runtime's allowlists judge what the job asks for;
        the cluster default's, under a namespace's runtime, judge that runtime's values too (its admins wrote them)."""
        out = []
        if self.guardrails is not None and self.runtime is not None:
            out.append((self.guardrails, self.guardrails_origin, False))
        if self.floor is not None and (floor := runtime_guardrails(self.floor, self.settings)) is not None:
            where = f"{self.floor.label}, the cluster's default under a namespace's runtime: spec.guardrails.{{}}"
            out.append((floor, where, True))
        return out


def _show(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def _image(spec: JobSpec, runtime: Runtime | None, settings: Settings) -> Value:
    stack = "ort" if spec.acceleration == "ort" else "default"
    if spec.image:
        return Value("spec.image", spec.image, "job")
    if runtime is not None and runtime.images.get(stack):
        return Value("spec.image", runtime.images[stack], f"runtime: spec.images.{stack}")
    helm = "trainer.ortImage" if stack == "ort" else "trainer.image"
    return Value("spec.image", settings.trainer_image(acceleration=spec.acceleration, image=None), f"Helm value {helm}")


# The Helm values that runtimes replace, still applied (under the job's and the runtime's values) for one release.
DEPRECATED_POD_DEFAULTS = (
    ("spec.podTemplate.nodeSelector", "trainer.nodeSelector", "trainer_node_selector"),
    ("spec.podTemplate.tolerations", "trainer.tolerations", "trainer_tolerations"),
    ("spec.podTemplate.priorityClassName", "trainer.priorityClassName", "trainer_priority_class"),
    ("spec.podTemplate.imagePullSecrets", "trainer.imagePullSecrets", "trainer_image_pull_secrets"),
)


def _guardrail_values(runtime: Runtime | None, settings: Settings) -> list[Value]:
    out = []
    for name, attr in GUARDRAILS.items():
        helm, theirs = getattr(settings, attr), None if runtime is None else runtime.guardrails.get(name)
        if helm != NO_GUARDRAILS[attr]:
            out.append(
                Value(f"guardrails.{name}", _show(list(helm) if isinstance(helm, tuple) else helm), "Helm value")
            )
        if theirs is not None:
            out.append(Value(f"guardrails.{name}", _show(theirs), "runtime: spec.guardrails"))
    return out


def runtime_guardrails(runtime: Runtime, settings: Settings) -> Settings | None:
    """The runtime's guardrails as a Settings layer of their own (every other guardrail off)."""
    if not runtime.guardrails:
        return None
    values = dict(NO_GUARDRAILS)
    for name, value in runtime.guardrails.items():
        if name in GUARDRAILS:
            attr = GUARDRAILS[name]
            values[attr] = tuple(value) if isinstance(value, list) else value
    return replace(settings, **values)


def _pin(template: dict[str, Any], pinned: dict[str, Any] | None) -> dict[str, Any]:
    """The template with the training settings of :data:`PINNED` as the job's first attempt ran them (``pinned``,
    status.runtime.training; None: the first attempt, nothing pinned yet)."""
    if pinned is None:
        return template
    out = copy.deepcopy(template)
    for path in PINNED:
        section, _, name = path.partition(".")
        if isinstance(out.get(section), dict):
            out[section].pop(name, None)
        if pinned.get(path) is not None:
            _put(out, path, pinned[path])
    return out


def resolve(
    raw: dict[str, Any], choice: Choice, settings: Settings, *, pinned: dict[str, Any] | None = None
) -> Effective:
    """The job (its raw spec) with its runtime. Raises :class:`SpecError` (every error, each naming its field and,
    for a value the runtime gave, the runtime) when the merged spec cannot run. ``pinned``: the training settings a
    runtime gave the job's first attempt, kept by every later one whatever its runtime says now."""
    runtime = choice.runtime
    if choice.error is not None:
        raise SpecError("spec.runtimeRef", choice.error.removeprefix("spec.runtimeRef: "))
    if runtime is not None and (size := len(json.dumps(runtime.template, separators=(",", ":")))) > MAX_TEMPLATE_BYTES:
        raise SpecError(
            "spec.runtimeRef",
            f"{runtime.label}: its spec.template is {size / 1024:.0f} KiB, over the {MAX_TEMPLATE_BYTES // 1024} KiB "
            "an attempt records in the job's status (status.runtime.template, with every job's status written "
            "whole); its owner should keep large values out of it (env from a ConfigMap or Secret by reference)",
        )
    template = _pin(runtime.template if runtime else {}, pinned)
    merged, sources = merge(raw, template)
    try:
        spec = parse_spec(merged)
    except SpecError as e:
        if runtime is None or not runtime.template:
            raise
        try:
            parse_spec(raw, complete=False)
        except SpecError:
            raise e from None  # the job's own errors: the runtime is not their cause
        # The job's own spec parses: every error comes of the runtime's values (or of their mix with the job's).
        given = {f"spec.{p}" for p, s in sources.items() if s != "job"}

        def why(field_path: str) -> str:
            exact = field_path in given or any(field_path.startswith((g + ".", g + "[")) for g in given)
            return (
                f"the value comes from {runtime.label}: spec.template" if exact else f"with {runtime.label}'s template"
            )

        lines = tuple((f, f"{m} ({why(f)})") for f, m in e.errors)
        raise SpecError(lines[0][0], lines[0][1], more=lines[1:]) from None
    effective = settings
    if runtime is not None and runtime.images:
        effective = replace(
            settings,
            default_image=runtime.images.get("default", settings.default_image),
            ort_image=runtime.images.get("ort", settings.ort_image),
        )
    values = [_image(spec, runtime, settings)]
    for template_path, source in sources.items():
        path = template_path
        if path == "output.volumeClaimTemplate" and _at(merged, path) is None:
            path = "output.claimName"  # the job names an existing claim
        values.append(
            Value(
                f"spec.{path}",
                _show(_at(merged, path)),
                {"job": "job", "runtime": "runtime: spec.template", "job + runtime": "job + runtime: spec.template"}[
                    source
                ]
                + (
                    " (as at the job's first attempt)"
                    if pinned is not None and path in PINNED and source == "runtime"
                    else ""
                ),
            )
        )
    for path, helm, attr in DEPRECATED_POD_DEFAULTS:
        if getattr(settings, attr):
            helm_value = getattr(settings, attr)
            shown = dict(helm_value) if attr == "trainer_node_selector" else helm_value
            values.append(Value(path, _show(shown), f"Helm value {helm} (deprecated: set it in a runtime)"))
    values += _guardrail_values(runtime, settings)
    return Effective(
        spec=spec,
        settings=effective,
        guardrails=runtime_guardrails(runtime, effective) if runtime else None,
        runtime=runtime,
        how=choice.how,
        values=tuple(values),
        floor=choice.floor,
        pinned={path: _at(merged, path) if sources.get(path) == "runtime" else None for path in PINNED},
        template=template,
    )


def record(eff: Effective, attempt: int) -> dict[str, Any]:
    """``status.runtime``: what the attempt was admitted with. The template as merged (the runtime's, its training
    settings as at the first attempt) is kept so that every later pass of the attempt (and ``finetune status``) sees
    the spec the pods were built from, whatever the runtime says now; the admitted resources so that the namespace's
    GPU usage, the GPU-seconds and the placeholders count what the pods hold, even if the spec was edited in the
    moment between their creation and this record."""
    out: dict[str, Any] = {
        "attempt": attempt,
        "chosenBy": eff.how,
        "values": [v.to_wire() for v in eff.values],
        "resources": copy.deepcopy(eff.spec.resources),
        "training": dict(eff.pinned),
    }
    if eff.runtime is not None:
        out.update(eff.runtime.snapshot())
    if eff.runtime is not None or eff.template:
        out["template"] = copy.deepcopy(eff.template)
    return out


def spec_of(wire: dict[str, Any], *, held: bool = False) -> JobSpec:
    """A FineTuneJob's spec as its current attempt runs it: merged with the runtime template it was admitted with
    (``status.runtime``, while that attempt is the current one and created); otherwise the job's own spec (an output
    claim may still come from a runtime). ``held``: what the job holds for the namespace's usage, where a job that
    is restarting still holds what its last attempt was admitted with (its pods may still be terminating) until the
    next attempt is admitted, whatever its spec says by then.
    Raises :class:`SpecError`."""
    raw, status = wire.get("spec") or {}, wire.get("status") or {}
    admitted = status.get("runtime")
    restarting = held and status.get("state") == "Restarting"
    if not (
        isinstance(admitted, dict)
        and (
            restarting or (admitted.get("attempt") == status.get("attempt", 0) and bool(status.get("attemptStartTime")))
        )
    ):  # not admitted yet, or between attempts: the next one reads its runtime again
        return parse_spec(raw, complete=False)
    return _admitted(raw, admitted)


def last_admitted_spec(wire: dict[str, Any]) -> JobSpec:
    """The spec the job's last admitted attempt was built from (``status.runtime``'s template merged in), whichever
    attempt is current now: what that attempt's pods and PodGroup were made with, for their clean-up. The job's own
    spec before any attempt was admitted. Raises :class:`SpecError`."""
    raw, admitted = wire.get("spec") or {}, (wire.get("status") or {}).get("runtime")
    return _admitted(raw, admitted) if isinstance(admitted, dict) else parse_spec(raw, complete=False)


def _admitted(raw: dict[str, Any], admitted: dict[str, Any]) -> JobSpec:
    merged = merge(raw, admitted.get("template") or {})[0]
    if isinstance(admitted.get("resources"), dict):  # what the pods were admitted with (spec_of's callers count it)
        merged["resources"] = admitted["resources"]
    return parse_spec(merged)
