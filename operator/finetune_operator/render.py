"""What the ``finetune`` user commands print, as pure functions of a FineTuneJob (and its pods and events): the
status block of ``finetune status``, the table of ``finetune list``, the one-line summary ``--follow`` ends with.

Nothing here talks to the API server (that is ``k8s``) or reads the terminal (that is ``jobctl``); the output is
rich renderables, so tests render them to text with a recording console.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from finetune_operator.history import series
from finetune_operator.status import FAILED, RUNNING, SUCCEEDED, SUSPENDED, Status, parse_ts

# C0 controls but tab and newline, DEL and C1: an escape sequence in a message could retitle or rewrite the terminal
_CONTROLS = {c: "\ufffd" for c in (*range(0x09), 0x0B, 0x0C, *range(0x0D, 0x20), *range(0x7F, 0xA0))}


def clean(value: Any) -> str:
    """Text from the cluster made safe for a terminal: messages come from trainer termination messages and events,
    which a job's own code writes, so every control character (escape sequences, BEL, carriage return) shows as
    U+FFFD. Rich markup is never parsed in it either: the CLI's consoles run with markup off, and tables get
    :class:`Text` cells (:func:`cell`)."""
    return str(value).translate(_CONTROLS)


def cell(value: Any) -> RenderableType:
    """A table cell from any value, cleaned (:func:`clean`); a :class:`Text` keeps its styles."""
    if value is None:
        return Text("")
    if isinstance(value, Text):
        out = value.copy()
        out.plain = clean(value.plain)  # one character for one: the spans still fit
        return out
    return Text(clean(value))


def _add(table: Table, *cells: Any) -> None:
    table.add_row(*(cell(c) for c in cells))


STYLE = {RUNNING: "green", SUCCEEDED: "bold green", FAILED: "bold red", "Restarting": "yellow", SUSPENDED: "cyan"}


def age(ts: str | None, now: datetime) -> str:
    """``kubectl``-style age: 45s, 3m12s, 2h5m, 3d4h."""
    t = parse_ts(ts)
    if t is None:
        return "-"
    s = max(0, int((now - t).total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def reason(status: dict[str, Any]) -> tuple[str, str]:
    """Why the job is in its state: (reason, message), as the operator derives status.reason (Status.explanation);
    derived again here, so a status an older operator wrote reads the same."""
    return Status.from_wire(status).explanation()


def progress_line(progress: dict[str, Any] | None) -> str:
    """Step, throughput, ETA and loss in one line ("" before the first scrape)."""
    if not progress:
        return ""
    parts = []
    step, total = progress.get("step"), progress.get("totalSteps")
    if step is not None:
        parts.append(f"step {step}/{total} ({100 * step // total}%)" if total else f"step {step}")
    if progress.get("samplesPerSecond") is not None:
        parts.append(f"{progress['samplesPerSecond']} samples/s")
    if progress.get("tokensPerSecond") is not None:
        parts.append(f"{progress['tokensPerSecond']} tokens/s")
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    if progress.get("evalLoss") is not None:
        parts.append(f"eval loss {progress['evalLoss']:.4g}")
    if progress.get("rewardMean") is not None:
        means = progress.get("rewardMeans") or {}
        each = f" ({', '.join(f'{k} {v:.3g}' for k, v in means.items())})" if means else ""
        parts.append(f"reward {progress['rewardMean']:.4g}{each}")
    if progress.get("eta"):
        parts.append(f"ETA {progress['eta']}")
    return ", ".join(parts)


def startup_line(progress: dict[str, Any]) -> str:
    """Where the current attempt's start-up went: "9.5s to the first step: launcher 7.7s, process group 1.3s, data
    0.12s, model 0.03s, first step 0.07s" ("" before the trainer reported it)."""
    total = progress.get("timeToFirstStepSeconds")
    if not total:
        return ""
    parts = []
    launcher, group = progress.get("launcherSeconds"), progress.get("rendezvousSeconds")
    if launcher is not None:
        parts.append(f"launcher {launcher:.3g}s")
    if group is not None:
        parts.append(f"process group {max(0.0, group - (launcher or 0)):.3g}s")
    for key, label in (("dataSeconds", "data"), ("modelSeconds", "model"), ("warmupSeconds", "first step")):
        if progress.get(key) is not None:
            parts.append(f"{label} {progress[key]:.3g}s")
    return f"{total:.3g}s to the first step" + (": " + ", ".join(parts) if parts else "")


def choice_line(progress: dict[str, Any]) -> str:
    """What the current attempt trains with and why: "compile, kernels liger: auto: ..." ("" before the trainer
    said)."""
    if not (progress.get("acceleration") or progress.get("kernels")):
        return ""
    line = f"{progress.get('acceleration') or 'acceleration unknown'}, kernels {progress.get('kernels') or 'unknown'}"
    return line + (f" ({progress['accelerationReason']})" if progress.get("accelerationReason") else "")


BARS = "▁▂▃▄▅▆▇█"


def sparkline(series: list[list[float]], width: int = 48) -> str:
    """Values as bars, one run per attempt separated by ``│`` (a restart), resampled (bucket means) to about
    ``width`` characters in all; the scale is shared by every attempt."""
    flat = [v for run in series for v in run]
    if not flat:
        return ""
    low, high = min(flat), max(flat)
    per = max(1.0, len(flat) / max(1, width - len(series) + 1))
    out = []
    for run in series:
        n = max(1, round(len(run) / per))
        chars = ""
        for i in range(n):
            bucket = run[int(i * len(run) / n) : max(int(i * len(run) / n) + 1, int((i + 1) * len(run) / n))]
            mean = sum(bucket) / len(bucket)
            level = 0 if high == low else round((mean - low) / (high - low) * (len(BARS) - 1))
            chars += BARS[level]
        out.append(chars)
    return "│".join(out)


def curve_rows(history: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``finetune status``'s curves from ``status.history``: (label, sparkline with first → last value and the steps
    covered) per series that has at least two points."""
    if not history:
        return []
    rows = []
    found = series(history)
    labels = (
        ("Loss", "loss", "{:.4g}"),
        ("Eval loss", "eval_loss", "{:.4g}"),
        ("Samples/s", "samples_per_second", "{:g}"),
        ("LR", "learning_rate", "{:.3g}"),
        ("Reward", "reward", "{:.4g}"),
    )
    for label, name, fmt in labels:
        have = found[name]
        if len(have) < 2:
            continue
        runs: dict[int, list[float]] = {}
        for attempt, _, value in have:
            runs.setdefault(attempt, []).append(value)
        (a0, s0, v0), (a1, s1, v1) = have[0], have[-1]
        attempts = f", attempts {a0}-{a1}" if len(runs) > 1 else ""
        rows.append(
            (
                label,
                f"{sparkline(list(runs.values()))}  {fmt.format(v0)} → {fmt.format(v1)} (steps {s0}-{s1}{attempts})",
            )
        )
    return rows


def status_block(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
    *,
    now: datetime | None = None,
    events_shown: int = 8,
) -> RenderableType:
    """``finetune status NAME``: state and reason, attempt and restarts, progress, the failure, the pods of the
    current attempt, the conditions and the newest events."""
    now = now or datetime.now(UTC)
    meta, spec, st = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    state = st.get("state") or "Pending"
    why, message = reason(st)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    created = age(meta.get("creationTimestamp"), now)
    _add(head, "Name", f"{meta['name']} (namespace {meta['namespace']}, age {created})")
    _add(head, "State", Text.assemble((state, STYLE.get(state, "")), f"  {why}" if why else ""))
    if message and not (state == FAILED and st.get("failure")):  # else the Failure row below says it
        _add(head, "", message)
    _add(
        head,
        "Attempt",
        f"{st.get('attempt', 0)} (restarts {st.get('restarts', 0)}/{spec.get('maxRestarts', 3)}, "
        f"disruptions {st.get('disruptions', 0)})",
    )
    _add(head, "Nodes", f"{st.get('nodes', '0/' + str(spec.get('nodes', 1)))} running")
    if line := elastic_line(st.get("elastic")):
        _add(head, "Elastic", line)
    if line := progress_line(st.get("progress")):
        _add(head, "Progress", line)
    for label, line in curve_rows(st.get("history")):
        _add(head, label, line)
    prog = st.get("progress") or {}
    if line := startup_line(prog):
        _add(head, "Start-up", line)
    if line := choice_line(prog):
        _add(head, "Trains with", Text(line))
    if prog.get("lastCheckpointStep") is not None:
        _add(head, "Checkpoint", f"step {prog['lastCheckpointStep']}")
    if prog.get("stepsLostToRestarts"):
        _add(head, "Lost", f"{prog['stepsLostToRestarts']} step(s) to restarts")
    if line := placement_line(st.get("placement"), st.get("attempt", 0)):
        _add(head, "Placement", Text(line))
    if line := runtime_line(st.get("runtime")):
        _add(head, "Runtime", f"{line} (attempt {st['runtime'].get('attempt', 0)})")
    if line := evaluation_line(st.get("evaluation")):
        _add(head, "Evaluation", Text(line))
    if f := st.get("failure"):
        where = f" on node {f['rank']}" if f.get("rank") is not None else ""
        where += f" in attempt {f['attempt']}" if f.get("attempt") is not None else ""
        _add(head, "Failure", Text(f"{f.get('reason')}{where}: {f.get('message', '')}", style="red"))
        if f.get("podName"):
            _add(head, "", f"its log: finetune logs {meta['name']} --rank {f.get('rank', 0)} (pod {f['podName']})")
    parts: list[RenderableType] = [head]
    if (st.get("runtime") or {}).get("values"):
        parts.append(effective_table(st["runtime"]["values"], title="Effective values (current attempt)"))
    if pods:
        t = Table(title="Pods", title_justify="left", box=None, pad_edge=False)
        for col in ("POD", "RANK", "ATTEMPT", "PHASE", "NODE", "AGE"):
            t.add_column(col)
        for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
            labels = p["metadata"].get("labels") or {}
            phase = (p.get("status") or {}).get("phase") or "Pending"
            if p["metadata"].get("deletionTimestamp"):
                phase = "Terminating"
            _add(
                t,
                p["metadata"]["name"],
                labels.get("finetune.dev/node-rank", "?"),
                labels.get("finetune.dev/attempt", "?"),
                phase,
                (p.get("spec") or {}).get("nodeName") or "-",
                age(p["metadata"].get("creationTimestamp"), now),
            )
        parts.append(t)
    if st.get("conditions"):
        t = Table(title="Conditions", title_justify="left", box=None, pad_edge=False)
        for col in ("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"):
            t.add_column(col, overflow="fold")
        for c in st["conditions"]:
            _add(
                t,
                c.get("type"),
                c.get("status"),
                c.get("reason"),
                age(c.get("lastTransitionTime"), now),
                c.get("message"),
            )
        parts.append(t)
    if events:
        t = Table(title="Events", title_justify="left", box=None, pad_edge=False)
        for col in ("AGE", "TYPE", "REASON", "MESSAGE"):
            t.add_column(col, overflow="fold")
        for e in events[-events_shown:]:
            _add(
                t,
                age(e.get("lastTimestamp") or e.get("eventTime"), now),
                e.get("type"),
                e.get("reason"),
                e.get("message"),
            )
        parts.append(t)
    return Group(*parts)


def placement_line(placed: dict[str, Any] | None, attempt: int) -> str:
    """Where the current attempt's ranks landed, runs of consecutive ranks per domain:
    "block: b1 (ranks 0-3)", "rack: r1 (ranks 0-1), r2 (ranks 2-4)"; "" for another attempt's record."""
    if not placed or placed.get("attempt") != attempt or not isinstance(placed.get("domains"), list):
        return ""
    runs: list[tuple[str, int, int]] = []
    for rank, domain in enumerate(placed["domains"]):
        if runs and runs[-1][0] == domain:
            runs[-1] = (domain, runs[-1][1], rank)
        else:
            runs.append((domain, rank, rank))
    parts = [
        f"{domain or '?'} (rank{'s' if last > first else ''} {first}{f'-{last}' if last > first else ''})"
        for domain, first, last in runs
    ]
    return f"{placed.get('level', '')}: {', '.join(parts)}"


def evaluation_line(ev: dict[str, Any] | None) -> str:
    """The trained model's scores: "held-out loss 0.75, reward accuracy 0.875 (step 60); stage Succeeded on 40
    sample(s) of split test: correct 0.5, format 1"."""
    if not ev:
        return ""
    held = [
        f"{label} {ev[key]:.4g}"
        for key, label in (
            ("loss", "held-out loss"),
            ("perplexity", "perplexity"),
            ("accuracy", "accuracy"),
            ("f1", "F1"),
            ("rewardAccuracy", "reward accuracy"),
            ("rewardMargin", "reward margin"),
        )
        if isinstance(ev.get(key), int | float)
    ]
    parts = [", ".join(held) + (f" (step {ev['step']})" if ev.get("step") is not None else "")] if held else []
    if ev.get("state"):
        stage = f"stage {ev['state']}"
        if ev.get("samples") is not None:
            stage += f" on {ev['samples']} sample(s) of split {ev.get('split')}"
        scores = ", ".join(f"{k} {v:.4g}" for k, v in (ev.get("scores") or {}).items() if isinstance(v, int | float))
        stage += f": {scores}" if scores else ""
        stage += f" ({ev['message']})" if ev.get("message") else ""
        parts.append(stage)
    return clean("; ".join(parts))


def elastic_line(el: dict[str, Any] | None) -> str:
    """An elastic job's size and batch: "1 of 2 node(s) (min 1), accumulation 2, global batch 16; 1 resize (last
    Shrunk), placeholders running 0"."""
    if not el:
        return ""
    batch = f"global batch {el.get('globalBatchSize')}"
    if el.get("askedGlobalBatchSize") not in (None, el.get("globalBatchSize")):
        batch += f" (asked {el['askedGlobalBatchSize']})"
    resizes = el.get("resizes") or 0
    last = f" (last {el['lastResize']})" if el.get("lastResize") else ""
    return (
        f"{el.get('currentNodes')} of {el.get('desiredNodes')} node(s) (min {el.get('minNodes')}), accumulation "
        f"{el.get('gradientAccumulationSteps')}, {batch}; {resizes} resize(s){last}, placeholders running "
        f"{el.get('placeholdersRunning') or 0}"
    )


def jobs_table(jobs: list[dict[str, Any]], *, all_namespaces: bool, now: datetime | None = None) -> Table:
    """``finetune list``: a row per job."""
    now = now or datetime.now(UTC)
    t = Table(box=None, pad_edge=False)
    cols = ["NAMESPACE"] if all_namespaces else []
    for col in (*cols, "NAME", "STATE", "REASON", "NODES", "STEP", "RESTARTS", "AGE"):
        t.add_column(col)
    for j in sorted(jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"])):
        st = j.get("status") or {}
        state = st.get("state") or "Pending"
        row = [j["metadata"]["namespace"]] if all_namespaces else []
        row += [
            j["metadata"]["name"],
            Text(state, style=STYLE.get(state, "")),
            reason(st)[0] or "-",
            st.get("nodes") or "-",
            (st.get("progress") or {}).get("stepOfTotal") or "-",
            str(st.get("restarts", 0)),
            age(j["metadata"].get("creationTimestamp"), now),
        ]
        _add(t, *row)
    return t


def final_line(job: dict[str, Any]) -> str:
    """What ``submit --follow`` and ``wait`` print when the job ends."""
    st = job.get("status") or {}
    why, message = reason(st)
    name = job["metadata"]["name"]
    extra = f" ({progress_line(st.get('progress'))})" if st.get("progress") else ""
    scores = f"; evaluation: {evaluation_line(st.get('evaluation'))}" if st.get("evaluation") else ""
    return clean(f"{name}: {st.get('state')} — {why}: {message}{extra}{scores}")


def effective_table(values: list[dict[str, str]], *, title: str, operator_known: bool = True) -> Table:
    """Each effective value with where it came from (runtimes.Value's wire form). ``operator_known=False``: the
    operator's own settings are not known here (``finetune validate`` runs with the user's RBAC), only named."""
    t = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for col in ("FIELD", "VALUE", "SOURCE"):
        t.add_column(col, overflow="fold")
    for v in values:
        value = v.get("value", "")
        if not operator_known and v.get("source", "").startswith("Helm value"):
            value = "(the operator's)"
        _add(t, v.get("field", ""), value, v.get("source", ""))
    return t


def runtime_line(record: dict[str, Any] | None) -> str:
    """``status.runtime`` (or a validate's choice) in one line."""
    if not record:
        return ""
    if not record.get("name"):
        return "none: the operator's own settings"
    return f"{record.get('kind')} {record['name']} (generation {record.get('generation')}), {record.get('chosenBy')}"


def runtimes_table(found: list[Any]) -> Table:
    """``finetune runtimes``: a row per runtime (runtimes.Runtime) a job of the namespace may name."""
    t = Table(box=None, pad_edge=False)
    for col in ("KIND", "NAME", "DEFAULT", "IMAGE", "QUEUE", "GPUS", "DESCRIPTION"):
        t.add_column(col, overflow="fold")
    for r in found:
        limits = (r.template.get("resources") or {}).get("limits") or {}
        _add(
            t,
            r.kind,
            r.name,
            "yes" if r.default else "",
            r.images.get("default", "(the operator's)"),
            str(r.template.get("queueName") or ""),
            str(limits.get("nvidia.com/gpu", "")),
            r.description,
        )
    return t
