"""The Python client for FineTuneJobs: what the ``finetune`` command does, for notebooks and scripts.

    from finetune_operator.client import FineTuneClient

    ft = FineTuneClient(namespace="team-a")          # your kubeconfig, as kubectl reads it
    job = ft.submit("examples/tiny-job.yaml")        # a path, YAML text, a manifest dict, or ft.manifest(name, spec)
    ft.follow(job.name)                              # a progress bar (and rank 0's log) until it ends
    ft.get(job.name).curves()["loss"]                # [(attempt, step, loss), ...] from status.history

It talks to the API server with the user's own kubeconfig and RBAC, through ``k8s.Kube``, and never imports kopf (the
operator's framework). Errors: :class:`UserError` for bad input (a manifest the typed spec or the API server refuses,
a job that does not exist; :class:`InvalidManifest` lists every error with its field), :class:`WaitTimeout` and
:class:`Unreachable` from :meth:`FineTuneClient.wait`, ``k8s.ApiError`` for what the API server answered otherwise.
The ``finetune`` command (jobctl) is a thin layer over this module: it maps these to its exit codes and prints.
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from finetune_operator import admission, guardrails, placement, runtimes
from finetune_operator.builders import JobRef, output_claim_name, output_path
from finetune_operator.history import series
from finetune_operator.k8s import ApiError, Kube, Rejected
from finetune_operator.settings import GROUP, LABEL_ATTEMPT, LABEL_RANK, OUTPUT_MOUNT, VERSION, Settings
from finetune_operator.spec import JobSpec, SpecError, check_name, elastic_problems, parse_spec, runtime_ref_of
from finetune_operator.status import FAILED, SUCCEEDED, TERMINAL

STATES = ("Succeeded", "Failed", "Running", "Suspended", "finished")  # what wait() can wait for


class UserError(Exception):
    """Bad input: a manifest refused, a job that does not exist, a finished job to suspend (the CLI's exit 2)."""


class InvalidManifest(UserError):
    """A manifest the typed spec or the API server refuses: ``errors`` holds one ``field: message`` line each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(errors))
        self.source, self.errors = source, errors


class Unreachable(Exception):
    """The job ended in another state than the one waited for (the CLI's exit 1); ``job`` is how it ended."""

    def __init__(self, job: Job, wanted: str) -> None:
        super().__init__(f"{job.final_line()} (waited for {wanted})")
        self.job, self.wanted = job, wanted


class WaitTimeout(TimeoutError):
    """``timeout`` passed before the job reached the state (the CLI's exit 124); ``job`` is where it was."""

    def __init__(self, job: Job, wanted: str, timeout: float) -> None:
        super().__init__(f"{job.name}: still {job.state} after {timeout:g}s (waited for {wanted})")
        self.job, self.wanted, self.timeout = job, wanted, timeout


@dataclass(frozen=True)
class Job:
    """A FineTuneJob as the API server returned it (``raw``), with the parts a notebook reads most."""

    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.raw["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.raw["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.raw["metadata"].get("uid", ""))

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.raw.get("status") or {})

    @property
    def state(self) -> str:
        return str(self.status.get("state") or "Pending")

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt", 0))

    @property
    def progress(self) -> dict[str, Any]:
        """``status.progress``: step, totalSteps, loss, evalLoss, samplesPerSecond, eta, ... ({} before a scrape)."""
        return dict(self.status.get("progress") or {})

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self.status.get("conditions") or [])

    def reason(self) -> tuple[str, str]:
        """Why the job is in its state: (reason, message)."""
        from finetune_operator import render

        return render.reason(self.status)

    def final_line(self) -> str:
        """One line: name, state, reason and progress (what ``finetune wait`` prints)."""
        from finetune_operator import render

        return render.final_line(self.raw)

    def curves(self) -> dict[str, list[tuple[int, int, float]]]:
        """``status.history`` as series of ``(attempt, step, value)``: ``loss``, ``eval_loss``, ``samples_per_second``
        and ``learning_rate``, each in step order within an attempt and attempts in order (docs/client.md)."""
        return series(self.status.get("history"))


curves = series  # the series of a status.history: finetune_operator.history.series


@dataclass(frozen=True)
class Submitted:
    """What :meth:`FineTuneClient.submit` did: ``verb`` is created, configured or unchanged (as kubectl apply says);
    ``finished_before`` is the state of a job that had already finished (a finished job never runs again)."""

    job: Job
    verb: str
    finished_before: str | None = None


def manifest(
    name: str,
    spec: dict[str, Any],
    *,
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A FineTuneJob manifest from a spec written as in YAML (camelCase fields: docs/reference.md)."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "FineTuneJob", "metadata": meta, "spec": spec}


def local_errors(job: dict[str, Any]) -> list[str]:
    """What the operator's typed spec refuses, each with its field (the same parser the operator runs)."""
    errors = []
    try:
        check_name(job["metadata"]["name"])
    except SpecError as e:
        errors.append(str(e))
    try:
        spec = parse_spec(job.get("spec") or {}, complete=False)  # the runtime may give the output claim
        errors.extend(f"{field}: {message}" for field, message in elastic_problems(spec))  # judged at admission
        meta = job["metadata"]
        ref = JobRef(name=meta["name"], namespace=meta.get("namespace") or "default", uid=meta.get("uid", ""))
        if (never := guardrails.always(ref, spec)) is not None:  # what no platform allows (the output path, ...)
            errors.append(never.message)
    except SpecError as e:
        errors.extend(e.lines())
    except (KeyError, TypeError, ValueError) as e:
        errors.append(f"spec: {e}")
    return errors


def typed_patch_errors(message: str) -> list[str]:
    """The fields of server-side apply's "failed to create typed patch object (...): <errors>" answer, one line each:
    one error is written inline (".spec.x: field not declared in schema"), several as an indented list after
    "errors:"."""
    tail = message.rpartition("): ")[2].strip() or message
    if not tail.startswith("errors:"):
        return [tail]
    return [line.strip() for line in tail.removeprefix("errors:").splitlines() if line.strip()] or [message]


def without_field(job: dict[str, Any], error: str) -> dict[str, Any] | None:
    """A copy of ``job`` without the field a typed-patch error names (".spec.training.learningRate: expected
    numeric..."), so that a second dry run can report the rest; None when the path is not a plain one of map keys."""
    path = error.split(":", 1)[0].strip().removeprefix(".")
    keys = path.split(".")
    if not path or any(not k or not k.replace("-", "").replace("_", "").isalnum() for k in keys):
        return None
    out = copy.deepcopy(job)
    node: Any = out
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None
    if keys[-1] not in node:
        return None
    del node[keys[-1]]
    return out


def merged_errors(local: list[str], server: list[str]) -> list[str]:
    """Every error of a manifest at once: the typed spec's, then the server's about fields the typed spec did not
    already name (both check some of the same rules; each field is reported once)."""
    named = {e.split(":", 1)[0].removeprefix(".") for e in local}
    return local + [e for e in server if e.split(":", 1)[0].removeprefix(".") not in named]


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


def _started(pod: dict[str, Any]) -> bool:
    """The container has started (or already ended): its log can be read."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if "running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {}):
            return True
    return False


def _connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str | None]:
    """An API client from the user's kubeconfig (``kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``), else
    in-cluster; and the namespace its context names."""
    from kubernetes import config

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        try:
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            if context:
                active = next((c for c in contexts if c["name"] == context), active)
            ctx_ns = (active.get("context") or {}).get("namespace")
        except (config.ConfigException, KeyError, TypeError):
            ctx_ns = None
    except config.ConfigException as kube_err:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            raise UserError(f"no kubeconfig: {kube_err} (give kubeconfig= / --kubeconfig or set $KUBECONFIG)") from None
        from kubernetes import client

        api = client.ApiClient()
        ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        ctx_ns = ns_file.read_text().strip() if ns_file.exists() else None
    return api, ctx_ns


class FineTuneClient:
    """FineTuneJobs in one namespace (``namespace``, else the kubeconfig context's, else ``default``) with the user's
    kubeconfig and RBAC. ``offline=True``: no cluster (only :meth:`check` with ``offline``); ``kube``: an existing
    ``k8s.Kube`` (tests, or a caller with its own API client)."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        kube: Kube | None = None,
        offline: bool = False,
        poll_seconds: float = 1.0,
    ) -> None:
        ctx_ns = None
        if kube is None and not offline:
            api, ctx_ns = _connect(kubeconfig, context)
            kube = Kube(api)
        self._kube = kube
        self.namespace = namespace or ctx_ns or "default"
        self.explicit_namespace = bool(namespace)
        self.poll_seconds = poll_seconds

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise UserError("this needs a cluster (drop --offline / offline=True)")
        return self._kube

    # -- manifests ------------------------------------------------------------------------------------------------

    def manifest(self, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
        """A manifest in this client's namespace (``labels=``, ``annotations=`` too): see :func:`manifest`."""
        return manifest(name, spec, namespace=meta.pop("namespace", None) or self.namespace, **meta)

    def load(self, source: str | Path | dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(where it came from, the one FineTuneJob) from a path (``-``: standard input), YAML text or a dict; its
        namespace resolved as kubectl does (the manifest's, else this client's; a conflict with an explicit namespace
        is an error)."""
        if isinstance(source, dict):
            where, docs = f"FineTuneJob {(source.get('metadata') or {}).get('name')!r}", [source]
        else:
            text, where = self._read(source)
            try:
                docs = [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as e:
                raise UserError(f"{where}: not valid YAML: {e}") from None
        jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "FineTuneJob"]
        if len(jobs) != 1:
            raise UserError(
                f"{where}: holds {len(jobs)} FineTuneJob(s); give exactly one "
                "(other objects, such as the claim it mounts, are applied with kubectl)"
            )
        job = yaml.safe_load(yaml.safe_dump(jobs[0]))  # a copy: the caller's dict is left as it was
        if job.get("apiVersion") != f"{GROUP}/{VERSION}":
            raise UserError(f"{where}: apiVersion {job.get('apiVersion')!r}: this finetune speaks {GROUP}/{VERSION}")
        meta = job.setdefault("metadata", {})
        if not isinstance(meta, dict) or not meta.get("name"):
            raise UserError(f"{where}: metadata.name is required")
        ns = meta.get("namespace")
        if ns and self.explicit_namespace and ns != self.namespace:
            raise UserError(
                f"{where}: metadata.namespace is {ns!r} but -n (namespace=) says {self.namespace!r}; drop one of them"
            )
        meta["namespace"] = ns or self.namespace
        return where, job

    @staticmethod
    def _read(source: str | Path) -> tuple[str, str]:
        if isinstance(source, str) and ("\n" in source or source.lstrip().startswith(("apiVersion:", "kind:", "{"))):
            return source, "the manifest text"
        try:
            return (sys.stdin.read() if str(source) == "-" else Path(source).read_text()), str(source)
        except OSError as e:
            raise UserError(f"{source}: {e.strerror}") from None

    def server_errors(self, job: dict[str, Any]) -> list[str]:
        """What the API server refuses in a dry run (the CRD's schema and CEL rules, admission)."""
        found: list[str] = []
        for _ in range(8):
            try:
                self.kube.apply_job(job, dry_run=True)
            except Rejected as e:
                # One line per invalid field when the server lists them (a 422 does), else its message.
                return found + ([f"{f}: {m}" if f else m for f, m in e.causes] or [e.message])
            except ApiError as e:
                # Server-side apply answers a field the schema does not declare, or of the wrong type, with a 500
                # ("failed to create typed patch object (...): .spec.x: ...") before any other check: the manifest's
                # fault, not the server's. Those fields are left out of one more dry run, which reports the rest.
                if not (e.code == 500 and "failed to create typed patch object" in e.message):
                    raise
                errors = typed_patch_errors(e.message)
                found += errors
                for error in errors:
                    if (smaller := without_field(job, error)) is None:
                        return found
                    job = smaller
                continue
            return found
        return found

    def check(self, source: str | Path | dict[str, Any], *, offline: bool = False) -> tuple[dict[str, Any], list[str]]:
        """The manifest and every error in it, each with its field: the typed spec's, then (unless ``offline``) a
        server dry run's for fields the typed spec did not name."""
        _, job = self.load(source)
        return job, self._errors(job, offline=offline)

    def _errors(self, job: dict[str, Any], *, offline: bool) -> list[str]:
        """Every error of the manifest in one report, each field once: the typed spec's and what no platform allows,
        then (online) the server dry run's, the job merged with its runtime (an output claim neither gives, say), the
        runtimes' guardrails and the claims it mounts."""
        errors = local_errors(job)
        if offline:
            return errors
        for more in (self.server_errors(job), self._runtime_errors(job)):
            errors = merged_errors(errors, more)
        return errors

    def effective(self, job: dict[str, Any]) -> runtimes.Effective | None:
        """What the job would run with if an attempt started now: its runtime (read with the user's RBAC) merged in
        (finetune_operator.runtimes). None when the user may not read the runtimes. The operator's own settings (Helm
        values) are not the user's to read: the values they decide are shown as the operator's. Raises
        :class:`SpecError` when the merged spec cannot run, or the runtime does not exist."""
        ref = runtime_ref_of((job.get("spec") or {}).get("runtimeRef"))  # the rest of the spec may hold errors
        try:
            choice = self.kube.runtime_choice(job["metadata"]["namespace"], ref)
        except ApiError as e:
            if e.code == 403:
                return None
            raise
        return runtimes.resolve(job.get("spec") or {}, choice, Settings())

    def _runtime_errors(self, job: dict[str, Any]) -> list[str]:
        """The runtime's share of the checks the operator makes when an attempt starts: the merged spec, and the
        runtime's guardrails (the operator's own are checked there)."""
        try:
            eff = self.effective(job)
        except SpecError as e:
            return e.lines()
        if eff is None:
            return []
        meta, own = job["metadata"], parse_spec(job.get("spec") or {}, complete=False)
        ref = JobRef(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))
        found = self._claim_errors(ref.name, ref.namespace, eff.spec) + self._placement_errors(ref.namespace, eff.spec)
        # An image of the operator's own settings (Helm values), which the user cannot read: the operator judges it
        helm_image = eff.values[0].source.startswith("Helm value")
        for layer, origin, theirs_too in eff.layers():
            violation = guardrails.check(
                ref,
                eff.spec,
                replace(layer, allowed_image_prefixes=()) if helm_image else layer,
                own=eff.spec if theirs_too else own,
                origin=origin,
                image_source=eff.image_source,
            )
            found += [violation.message] if violation else []
        return found

    def _claim_errors(self, name: str, namespace: str, spec: JobSpec) -> list[str]:
        """The operator's check of the claims the job mounts (a ReadWriteOnce output for several nodes, a read-only
        one), read with the user's RBAC; nothing said of a claim the user may not read or that does not exist yet."""
        claims = {}
        for _, claim in admission.claims_to_check(name, spec):
            try:
                pvc = self.kube.get_claim(namespace, claim)
            except ApiError as e:
                if e.code == 403:
                    continue
                raise
            if pvc is not None:
                claims[claim] = pvc
        violation = admission.check_claims(name, spec, claims)
        return [violation.message] if violation else []

    def _placement_errors(self, namespace: str, spec: JobSpec) -> list[str]:
        """The operator's check of spec.topology against the job's Kueue queue (finetune_operator.placement), read with
        the user's RBAC; nothing said where the user may not read a queue, a flavor or a Topology."""
        if spec.topology is None:
            return []
        qt = placement.read_queue_topology(
            lambda plural, name, ns: self.kube.get_kueue(plural, name, ns), namespace, spec.queue_name
        )
        why = placement.check(spec.topology, qt)
        return [why] if why else []

    def validate(self, source: str | Path | dict[str, Any], *, offline: bool = False) -> JobSpec:
        """The typed spec the operator will run (defaults filled in, and online its runtime's template); raises
        :class:`InvalidManifest`."""
        where, job = self.load(source)
        if errors := self._errors(job, offline=offline):
            raise InvalidManifest(where, errors)
        eff = None if offline else self.effective(job)
        return eff.spec if eff is not None else parse_spec(job["spec"], complete=False)

    def runtimes(self) -> list[runtimes.Runtime]:
        """The runtimes a job of this namespace may name: the namespace's FineTuneRuntimes, then the cluster's
        ClusterFineTuneRuntimes (those the user may read)."""
        found: list[runtimes.Runtime] = []
        for kind, ns in ((runtimes.NAMESPACED_KIND, self.namespace), (runtimes.CLUSTER_KIND, None)):
            try:
                listed = map(runtimes.read_runtime, self.kube.list_runtimes(runtimes.PLURALS[kind], ns))
                found += [r for r in listed if r.allows(self.namespace)]
            except ApiError as e:
                if e.code != 403:
                    raise
        return found

    def submit(self, source: str | Path | dict[str, Any], *, force_conflicts: bool = False) -> Submitted:
        """Check the manifest (as :meth:`validate`), then apply it (server-side apply, field manager ``finetune``)."""
        where, job = self.load(source)
        if errors := self._errors(job, offline=False):
            raise InvalidManifest(where, errors)
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        before = self.kube.get_job(ns, name)
        try:
            applied = self.kube.apply_job(job, dry_run=False, force=force_conflicts)
        except ApiError as e:
            if e.code == 409:
                raise UserError(
                    f"{name}: {e.message} (another manager owns these fields; force_conflicts / --force-conflicts "
                    "takes them over)"
                ) from None
            raise
        if before is None:
            verb = "created"
        elif before["metadata"].get("uid") != applied["metadata"].get("uid"):
            verb = "created (a job of that name was being deleted)"
        elif before["metadata"].get("generation") == applied["metadata"].get("generation"):
            verb = "unchanged"
        else:
            verb = "configured"
        was = (before or {}).get("status") or {}
        finished = was.get("state") if was.get("state") in TERMINAL and not verb.startswith("created") else None
        return Submitted(Job(applied), verb, finished)

    # -- reading ----------------------------------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> Job:
        ns = namespace or self.namespace
        raw = self.kube.get_job(ns, name)
        if raw is None:
            raise UserError(f"FineTuneJob {ns}/{name} not found")
        return Job(raw)

    def list_jobs(self, *, all_namespaces: bool = False) -> list[Job]:
        """The jobs of this namespace (or of every namespace), by namespace and name."""
        raw = self.kube.list_jobs(None if all_namespaces else self.namespace)
        return [Job(j) for j in sorted(raw, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))]

    def first_jobs(self, limit: int, *, all_namespaces: bool = False) -> tuple[list[Job], int | None]:
        """At most ``limit`` jobs (the first by namespace and name) in one request, and how many more there are (None:
        unknown): what a page that refreshes every few seconds can afford with thousands of jobs."""
        raw, more = self.kube.list_jobs_first(None if all_namespaces else self.namespace, limit)
        return [Job(j) for j in sorted(raw, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))], more

    def pods(self, name: str, *, attempt: int | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """The job's pods (of one attempt, when given)."""
        pods = self.kube.list_pods(namespace or self.namespace, name)
        return [p for p in pods if attempt is None or _labels(p).get(LABEL_ATTEMPT) == str(attempt)]

    def events(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The job's Events, oldest first."""
        return self.kube.list_job_events(namespace or self.namespace, name)

    def status_pods(self, job: Job) -> list[dict[str, Any]]:
        """The pods ``finetune status`` shows: the current attempt's, and the kept pod of the rank that failed."""
        kept = (job.status.get("failure") or {}).get("podName")
        return [
            p
            for p in self.pods(job.name, namespace=job.namespace)
            if _labels(p).get(LABEL_ATTEMPT) == str(job.attempt) or p["metadata"]["name"] == kept
        ]

    # -- waiting and following ---------------------------------------------------------------------------------------

    def wait(
        self,
        name: str,
        *,
        for_: str = "finished",
        timeout: float | None = None,
        on_poll: Callable[[Job], None] | None = None,
        uid: str | None = None,
    ) -> Job:
        """Block until the job reaches ``for_`` (Succeeded, Failed, Running, Suspended, or finished: Succeeded or
        Failed) and return it. Raises :class:`Unreachable` when it ends in another state, :class:`WaitTimeout` after
        ``timeout`` seconds, :class:`UserError` when it is (or, with ``uid``, its incarnation is) deleted."""
        if for_ not in STATES:
            raise UserError(f"for_={for_!r}: wait for one of {', '.join(STATES)}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(name)
            if uid is not None and job.uid != uid:
                raise UserError(f"FineTuneJob {job.namespace}/{name} was deleted")
            if on_poll is not None:
                on_poll(job)
            if job.state in TERMINAL if for_ == "finished" else job.state == for_:
                return job
            if job.finished:  # it will never get there
                raise Unreachable(job, for_)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job, for_, timeout or 0.0)
            time.sleep(self.poll_seconds)

    def follow(
        self,
        name: str,
        *,
        logs: bool | Callable[[str], None] = True,
        uid: str | None = None,
        console: Any = None,
    ) -> Job:
        """A progress bar from ``status.progress`` (a rich bar: a widget in Jupyter with ipywidgets, text in a
        terminal) while rank 0's log of each attempt in turn goes to ``logs`` (True: standard output; a callable gets
        each line; False: none), until the job ends; returns the job as it ended."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from finetune_operator import render

        bar = Progress(
            TextColumn("{task.fields[state]}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            TimeElapsedColumn(),
            console=console or Console(stderr=True, soft_wrap=True, markup=False),
            transient=False,
        )
        write = logs if callable(logs) else raw_line
        follower = _LogFollower(self, self.namespace, name, write) if logs else None
        task = bar.add_task(name, total=None, state="Pending", detail="")

        def show(job: Job) -> None:
            bar.update(
                task,
                total=job.progress.get("totalSteps"),
                completed=job.progress.get("step") or 0,
                state=f"{job.state} (attempt {job.attempt})",
                detail=render.progress_line(job.progress).partition(", ")[2],
            )

        try:
            with bar:
                if follower is not None:
                    follower.start()
                job = self.wait(name, on_poll=show, uid=uid)
                if follower is not None:  # the last lines of rank 0: its stream ends with the container
                    follower.finishing.set()
                    follower.join(timeout=30)
        finally:
            if follower is not None:
                follower.done.set()
        return job

    # -- logs --------------------------------------------------------------------------------------------------------

    def log_lines(
        self,
        pod: str,
        *,
        follow: bool = False,
        tail: int | None = None,
        namespace: str | None = None,
        limit_bytes: int | None = None,
    ) -> Iterator[str]:
        """A pod's trainer log, line by line (following it while it runs), at most ``limit_bytes`` of it. Linear in
        the log's size: a chunk is split once, and a long line grows in place."""
        resp = self.kube.pod_log(
            namespace or self.namespace, pod, follow=follow, tail_lines=tail, limit_bytes=limit_bytes
        )
        pending = bytearray()
        try:
            for chunk in resp.stream(4096, decode_content=True):
                start = 0
                while (end := chunk.find(b"\n", start)) != -1:
                    pending += chunk[start:end]
                    yield pending.decode(errors="replace")
                    pending.clear()
                    start = end + 1
                pending += chunk[start:]
            if pending:
                yield pending.decode(errors="replace")
        finally:
            resp.release_conn()

    def rank_pods(
        self, name: str, *, ranks: list[int] | None = None, attempt: int | None = None, job: Job | None = None
    ) -> dict[int, str]:
        """{rank: pod name} of an attempt (default: the current one) for ``ranks`` (default: every rank); raises
        :class:`UserError` saying where the log is when none of them has a pod."""
        job = job or self.get(name)
        attempt = job.attempt if attempt is None else attempt
        nodes = int((job.raw.get("spec") or {}).get("nodes") or 1)
        wanted = list(range(nodes)) if ranks is None else ranks
        found: dict[int, str] = {}
        for p in self.pods(name, attempt=attempt):
            rank = _labels(p).get(LABEL_RANK)
            if rank is not None and rank.isdigit() and int(rank) in wanted:
                found[int(rank)] = p["metadata"]["name"]
        if not found:
            raise UserError(no_pod(job.raw, attempt, wanted, job.attempt))
        return found

    def logs(
        self,
        name: str,
        *,
        rank: int = 0,
        attempt: int | None = None,
        follow: bool = False,
        tail: int | None = None,
    ) -> Iterator[str]:
        """One rank's trainer log (rank 0 of the current attempt by default), line by line."""
        pod = self.rank_pods(name, ranks=[rank], attempt=attempt)[rank]
        yield from self.log_lines(pod, follow=follow, tail=tail)

    def logs_all(
        self,
        name: str,
        *,
        attempt: int | None = None,
        follow: bool = False,
        tail: int | None = None,
        pods: dict[int, str] | None = None,
    ) -> Iterator[tuple[int, str]]:
        """Every rank's log at once (or those of ``pods``, from :meth:`rank_pods`), as ``(rank, line)`` in the order
        the lines arrive."""
        pods = pods or self.rank_pods(name, attempt=attempt)
        lines: queue.Queue[tuple[int, str] | None] = queue.Queue(maxsize=1024)

        def pump(rank: int, pod: str) -> None:
            try:
                for line in self.log_lines(pod, follow=follow, tail=tail):
                    lines.put((rank, line))
            except ApiError as e:
                lines.put((rank, f"(log of {pod}: {e.message})"))
            finally:
                lines.put(None)

        for rank, pod in sorted(pods.items()):
            threading.Thread(target=pump, args=(rank, pod), daemon=True, name=f"log-{pod}").start()
        open_streams = len(pods)
        while open_streams:
            item = lines.get()
            if item is None:
                open_streams -= 1
            else:
                yield item

    # -- changing ----------------------------------------------------------------------------------------------------

    def suspend(self, name: str) -> Job:
        """``spec.suspend=true``: the pods go, each rank saving a checkpoint on SIGTERM."""
        return self._set_suspend(name, True)

    def resume(self, name: str) -> Job:
        """``spec.suspend=false``: a new attempt starts from the newest checkpoint."""
        return self._set_suspend(name, False)

    def _set_suspend(self, name: str, suspend: bool) -> Job:
        job = self.get(name)
        if job.finished:
            raise UserError(f"{name} has finished ({job.state}): nothing to {'suspend' if suspend else 'resume'}")
        patched = self.kube.patch_job_spec(self.namespace, name, {"suspend": suspend})
        if patched is None:
            raise UserError(f"FineTuneJob {self.namespace}/{name} not found")
        return Job(patched)

    def delete(self, name: str, *, wait: bool = False, timeout: float = 300.0) -> None:
        """Delete the job (its pods, Service and ConfigMap go with it); ``wait``: until the job and its pods are
        gone (raises ``TimeoutError`` after ``timeout`` seconds)."""
        if not self.kube.delete_job_named(self.namespace, name):
            raise UserError(f"FineTuneJob {self.namespace}/{name} not found")
        if wait:
            self.delete_wait(name, timeout=timeout)

    def delete_wait(self, name: str, *, timeout: float = 300.0) -> None:
        """Until the job and its pods are gone (``TimeoutError`` after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while self.kube.get_job(self.namespace, name) is not None or self.kube.list_pods(self.namespace, name):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{name}: still terminating after {timeout:g}s")
            time.sleep(self.poll_seconds)


def raw_line(line: str) -> None:
    """A log line as the trainer wrote it (no markup, no wrapping, control characters kept), as kubectl logs."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class _LogFollower(threading.Thread):
    """Streams rank 0's log of each attempt in turn, while the job runs (a gang restart moves it to the new pod)."""

    def __init__(self, client: FineTuneClient, ns: str, name: str, write: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name="log-follower")
        self.client, self.ns, self.name, self.write = client, ns, name, write
        self.done = threading.Event()  # stop now
        self.finishing = threading.Event()  # the job ended: stop once no rank 0 log is left to stream
        self.followed: set[str] = set()  # pod uids whose log was streamed to its end

    def run(self) -> None:
        while not self.done.is_set():
            pod = next(
                (
                    p
                    for p in self.client.pods(self.name, namespace=self.ns)
                    if _labels(p).get(LABEL_RANK) == "0" and p["metadata"]["uid"] not in self.followed and _started(p)
                ),
                None,
            )
            if pod is None:
                if self.finishing.is_set():
                    return
                self.done.wait(self.client.poll_seconds)
                continue
            attempt = _labels(pod).get(LABEL_ATTEMPT)
            self.write(f"--- {pod['metadata']['name']} (attempt {attempt}, rank 0) ---")
            try:
                for line in self.client.log_lines(pod["metadata"]["name"], follow=True, namespace=self.ns):
                    self.write(line)
            except ApiError as e:
                if e.code not in (400, 404):  # 400: not started yet, or the pod is gone; 404: deleted
                    self.write(f"(log of {pod['metadata']['name']}: {e.message})")
                self.done.wait(self.client.poll_seconds)
                if e.code in (400,) and not _started(pod):
                    continue
            self.followed.add(pod["metadata"]["uid"])


def no_pod(job: dict[str, Any], attempt: int, ranks: list[int], current: int) -> str:
    """Why a rank of an attempt has no pod, and where its log is."""
    name = job["metadata"]["name"]
    which = ", ".join(str(r) for r in ranks)
    if attempt < current:
        try:
            spec = parse_spec(job.get("spec") or {}, complete=False)
        except (SpecError, KeyError, TypeError, ValueError):
            return f"{name}: no pod of attempt {attempt} for rank {which}: a gang restart replaces an attempt's pods"
        ref = JobRef(name=name, namespace=job["metadata"]["namespace"], uid=job["metadata"].get("uid", ""))
        inside = output_path(ref, spec)[len(OUTPUT_MOUNT) + 1 :]
        return (
            f"{name}: no pod of attempt {attempt} for rank {which}: a gang restart replaces an attempt's pods. "
            f"Every rank also writes its log to the output claim {output_claim_name(name, spec)}, at "
            f'{inside}/logs/attempt-{attempt}/node-<rank>.log (docs/cli.md, "Logs of earlier attempts")'
        )
    if attempt > current:
        return f"{name}: attempt {attempt} has not started (the current attempt is {current})"
    return f"{name}: rank {which} of attempt {attempt} has no pod (yet): see finetune status {name}"


__all__ = [
    "FAILED",
    "SUCCEEDED",
    "FineTuneClient",
    "InvalidManifest",
    "Job",
    "Submitted",
    "Unreachable",
    "UserError",
    "WaitTimeout",
    "curves",
    "manifest",
]
