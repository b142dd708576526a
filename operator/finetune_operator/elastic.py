"""Elastic jobs, the pure part: how big the next attempt is, and what it trains with at that size. No I/O here.

A job with ``spec.elastic`` runs each attempt as a fixed-size gang (one ``torchrun`` rendezvous of known size, as every
other attempt) of between ``minNodes`` and ``spec.nodes`` nodes. The size changes only between attempts:

* **shrink**: an attempt ends with ranks lost (their node gone, their pod evicted or preempted): the next attempt runs
  on the nodes the surviving ranks held, the only ones known to fit it; an attempt whose ranks stay unschedulable past
  ``unschedulableSeconds`` is followed by one on the ranks that were placed. Never below ``minNodes``: there the job
  waits for the scheduler, as a fixed-size job does.
* **grow**: while smaller than ``spec.nodes``, the operator keeps one low-priority placeholder pod per missing rank
  (the trainer pod's resources, node selector, tolerations and affinity); the scheduler placing one, and its kubelet
  running it, is the proof that a node fits a rank again. At most once per ``resizeCooldownSeconds``, the gang is
  stopped at an agreed step (its SIGTERM checkpoint) and the next attempt runs with the placeholders' nodes added.

The global batch is the one the job asked for at full size: world size x per-device batch x gradient accumulation, with
the accumulation adapted to the attempt's world size (the nearest whole number where it cannot be exact; the status and
the trainer's result say what was used). The number of optimizer steps per epoch, and so the learning-rate schedule
by step, is then the same at every size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from finetune_operator.spec import JobSpec


@dataclass(frozen=True)
class Batch:
    """The gradient accumulation an attempt of ``nodes`` nodes trains with, and the global batch it gives."""

    nodes: int
    gradient_accumulation_steps: int
    global_batch_size: int
    asked_global_batch_size: int

    @property
    def exact(self) -> bool:
        return self.global_batch_size == self.asked_global_batch_size


def asked_global_batch(spec: JobSpec) -> int:
    """The global batch the job asks for: at spec.nodes, with its own gradient accumulation."""
    t = spec.training
    return t.per_device_batch_size * t.gradient_accumulation_steps * spec.procs_per_node * spec.nodes


def batch_at(spec: JobSpec, nodes: int) -> Batch:
    """The accumulation that keeps the asked global batch at ``nodes`` nodes: exact when the per-step rows of that
    world size divide it, else the whole number nearest to it (of two as near, the larger: never fewer rows per step
    than a smaller size already trains with)."""
    asked = asked_global_batch(spec)
    per_step = spec.training.per_device_batch_size * spec.procs_per_node * nodes  # rows of one micro-batch, job-wide
    low = max(1, asked // per_step)
    accum = min((low, low + 1), key=lambda a: (abs(a * per_step - asked), -a))
    return Batch(nodes, accum, accum * per_step, asked)


def sized(spec: JobSpec, nodes: int) -> JobSpec:
    """``spec`` as one attempt of ``nodes`` nodes runs it: the gang, its rendezvous and its config at that size, with
    the accumulation of :func:`batch_at`. The job's own spec (spec.nodes the size asked for) when not elastic."""
    if spec.elastic is None:
        return spec
    batch = batch_at(spec, nodes)
    training = replace(
        spec.training,
        gradient_accumulation_steps=batch.gradient_accumulation_steps,
        global_batch_size=batch.asked_global_batch_size,
    )
    return replace(spec, nodes=nodes, training=training)


def after_loss(spec: JobSpec, size: int, lost: int) -> int:
    """The next attempt's size after ``lost`` of the ``size`` ranks were lost: what the survivors held, never below
    minNodes (there the job waits for nodes to come back, as a fixed-size one does)."""
    assert spec.elastic is not None
    return max(spec.elastic.min_nodes, size - lost)


def grown(spec: JobSpec, size: int, capacity: int) -> int:
    """The next attempt's size when ``capacity`` placeholders run: the current size plus them, at most spec.nodes."""
    return min(spec.nodes, size + capacity)
