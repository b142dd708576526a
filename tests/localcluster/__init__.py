"""A local control plane of real Kubernetes binaries, for tests and the README's main job."""

from tests.localcluster.cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
