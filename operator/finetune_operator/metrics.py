"""The operator's own Prometheus metrics (the trainers export training throughput themselves)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    """One registry per operator instance, so tests can run several without global state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # By namespace, so a platform can route alerts to the team that owns it. The label is finetune_namespace,
        # not namespace: Prometheus sets namespace on every target (the operator's own) and would rename ours.
        # Bounded: namespaces that hold FineTuneJobs x 7 states; a namespace's series go with its last job.
        self.jobs = Gauge(
            "finetune_operator_jobs",
            "FineTuneJobs by namespace and state, as last reconciled",
            ["finetune_namespace", "state"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "finetune_operator_reconcile_duration_seconds",
            "Duration of one reconcile pass",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.reconcile_errors = Counter(
            "finetune_operator_reconcile_errors_total", "Reconcile passes that raised", registry=self.registry
        )
        self.pods_created = Counter(
            "finetune_operator_pods_created_total", "Trainer pods created", registry=self.registry
        )
        self.pods_deleted = Counter(
            "finetune_operator_pods_deleted_total", "Trainer pods deleted", registry=self.registry
        )
        # namespaces x the restart reasons that occurred there (a fixed set: OOMKilled, Evicted, TrainingError, ...)
        self.restarts = Counter(
            "finetune_operator_gang_restarts_total",
            "Gang restarts by namespace and failure reason",
            ["finetune_namespace", "reason"],
            registry=self.registry,
        )
        # An elastic job's resizes (Shrunk, Grown) and the steps they threw away (trained since the newest checkpoint
        # the operator saw: an upper bound for a grow, whose gang checkpoints at its agreed step).
        self.resizes = Counter(
            "finetune_operator_resizes_total",
            "Elastic gang resizes by namespace and direction (Shrunk, Grown)",
            ["finetune_namespace", "direction"],
            registry=self.registry,
        )
        self.steps_lost_to_resizes = Counter(
            "finetune_operator_resize_steps_lost_total",
            "Optimizer steps trained since the newest checkpoint when an elastic gang was resized",
            ["finetune_namespace"],
            registry=self.registry,
        )
        self.status_writes = Counter(
            "finetune_operator_status_writes_total", "FineTuneJob status writes", registry=self.registry
        )
        # Whether this replica runs the backstop (deadlines, TTLs, retries, progress): an alert fires when no replica
        # does. Standalone, always 1.
        self.backstop_active = Gauge(
            "finetune_operator_backstop_active",
            "1 while this replica runs the backstop loop (the active peer), else 0",
            registry=self.registry,
        )
        self.backstop_active.set(1)
        self.peering_missing = Gauge(
            "finetune_operator_peering_objects_missing",
            "Watched namespaces (or the cluster) whose KopfPeering object is missing",
            registry=self.registry,
        )
        # Jobs whose rank 0 page was slow (trickled, hung, huge): their scrapes run on a lane of their own.
        self.scrapes_slow = Gauge(
            "finetune_operator_scrapes_slow",
            "Jobs whose metrics page was slow to scrape, scraped on the slow lane until quick again",
            registry=self.registry,
        )
        # The backstop's heartbeat: the liveness probe fails when it stops (a loop stuck on a lock or a request).
        self.backstop_tick = Gauge(
            "finetune_operator_backstop_last_tick_timestamp_seconds",
            "When the backstop loop last completed a tick (Unix time)",
            registry=self.registry,
        )
