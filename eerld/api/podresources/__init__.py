"""The kubelet's pod-resources API, as eerld reads it: a gRPC client of ``v1.PodResourcesLister/List``.

``api.proto`` holds the few messages eerld needs (upstream's names and field numbers); ``api_pb2`` is
generated from it (``make proto``). :class:`KubeletPodResources` is the
:class:`~eerld.pods.owners.PodResourcesLister` that :mod:`eerld.api.server` hands the metrics.
"""

from eerld.api.podresources.client import LIST_METHOD, KubeletPodResources

__all__ = ["LIST_METHOD", "KubeletPodResources"]
