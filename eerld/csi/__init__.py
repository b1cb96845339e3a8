"""eerl-csi: a CSI node plugin that gives a Kubernetes pod a grant socket of its own, for exactly its GPUs.

A pod that names an inline ``csi`` volume of driver ``csi.eerl.dev`` gets, at the volume's mount path, a
socket of the node's eerld whose sessions may claim only the GPUs the kubelet allocated to that pod: no
hostPath, so the pod stays at the "restricted" Pod Security level (docs/sidecar.md, docs/deployment.md).

The parts, each one job:

- :mod:`eerld.csi.volume`: the NodePublishVolume request checked (pod identity from the kubelet, who may
  connect from ``volumeAttributes``; nothing else is taken from the pod author).
- :mod:`eerld.csi.pods`: which GPUs a pod gets, from the kubelet's pod-resources answer (pure).
- :mod:`eerld.csi.grant`: the grant asked of eerld for a volume (pure), and :mod:`eerld.csi.eerld_admin`
  the client of eerld's admin socket that asks it.
- :mod:`eerld.csi.mounts`: the bind mount of the grant's directory at the target path.
- :mod:`eerld.csi.records`: what is published, on disk, so that a restart can find grants of deleted pods.
- :mod:`eerld.csi.node`: publish, unpublish and reconcile, in plain Python over those parts.
- :mod:`eerld.csi.servicers` (CSI Identity and Node over gRPC), :mod:`eerld.csi.server` and
  :mod:`eerld.csi.main` (the ``eerl-csi`` command).

The generated CSI code is :mod:`eerld.csi.proto` (the spec's ``csi.proto``, v1.12.0, ``make proto``).
"""

DRIVER_NAME = "csi.eerl.dev"

__all__ = ["DRIVER_NAME"]
