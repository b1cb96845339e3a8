"""Kubernetes pods and their GPUs, in plain Python: which pod's container the kubelet allocated each GPU to
(:mod:`~eerld.pods.owners`), which sessions hold a GPU that left its pod (:mod:`~eerld.pods.claims`, pure)
and the thread that polls the kubelet and ends those sessions (:mod:`~eerld.pods.watch`). The kubelet's
pod-resources gRPC client is the API layer's (:mod:`eerld.api.podresources`)."""
