"""The Container Storage Interface, as eerl-csi serves it: ``csi.proto`` is the spec's own file, unchanged
(container-storage-interface/spec v1.12.0, commit e6fc13ea4d529db12e211ef79c924ee3186c39d5, Apache-2.0);
``csi_pb2`` and ``csi_pb2_grpc`` are generated from it (``make proto``, scripts/gen_protos.py)."""

__all__: list[str] = []
