"""A local control plane of real Kubernetes binaries, for tests and the README's main job."""

from hack.localcluster.cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
