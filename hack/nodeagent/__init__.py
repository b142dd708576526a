"""The local node agent: a documented test double for kubelet + container runtime.

Used by the end-to-end tests (``tests/e2e``) and runnable on its own::

    python -m hack.nodeagent --kubeconfig K --node local-agent --claims-dir DIR [--namespace NS]

What it does, like a kubelet: registers a ``Node`` (Ready, capacity, a heartbeat ``Lease`` in
``kube-node-lease`` and node status every 10 s); binds unscheduled FineTuneJob pods (label
``finetune.dev/job-name``, no ``nodeName``) to itself through the ``Binding`` subresource; runs each pod's
single container as local processes — command/args/env from the pod spec (``valueFrom`` configMap/secret keys
resolved), volumes materialised, the image's samples at ``/opt/finetune/samples`` (as the trainer images link
them), in a network namespace of its own (veth to the agent's bridge,
``10.200.<k>.<n>/24``), a mount namespace (bind mounts put ``/etc/finetune``, ``/output``, ``/workspace``,
``/tmp``, ``/dev/shm``, ``/dev/termination-log``, ``/etc/hosts``, ``/etc/hostname``, ``/etc/resolv.conf`` where
the pod expects them), a UTS namespace (hostname = ``spec.hostname``) and a PID namespace (the command is PID 1;
killing PID 1 kills the whole tree, torchrun's workers in their own sessions included); reports pod status through
the API (Pending → Running with podIP, startTime, containerStatuses, Ready; terminated with exitCode, reason
``Completed``/``Error``, ``message`` from the termination log or, with ``FallbackToLogsOnError``, the log tail;
phase ``Succeeded``/``Failed``); on deletion sends SIGTERM to PID 1, SIGKILL to the PID namespace after the
grace period, then completes the deletion (grace 0, UID precondition) — a bound pod is removed only once its
kubelet confirms.

What differs from a kubelet (see ``docs/operations.md``, "Local node agent"): no images (the "image" is a local
virtualenv holding ``finetune-trainer``; ``image`` is reported, never pulled); processes run as root, not as
``runAsUser`` (no seccomp, capabilities kept, root filesystem writable); one container per pod, no init
containers, probes, restarts (``restartPolicy: Never`` only), resource limits or cgroups (so no real
``OOMKilled``); PVCs are plain directories ``<claims-dir>/<namespace>/<claimName>`` (no binding or access modes);
cluster DNS is a per-pod hosts file listing ``<hostname>.<subdomain>[.<ns>[.svc[.cluster.local]]]`` for pods of
the namespace whose headless Service exists; no Service VIPs, no egress; ``kubectl logs`` [``-f``] works (the
kubelet API's ``/containerLogs``, served over HTTPS from the log files under ``<state-dir>/logs``,
hack/nodeagent/kubeletapi.py), ``exec``, ``attach`` and ``port-forward`` do not.
"""

from hack.nodeagent.agent import NodeAgent, PodRun

__all__ = ["NodeAgent", "PodRun"]
