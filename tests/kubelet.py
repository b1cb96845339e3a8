"""A fake kubelet's pod-resources API, the one the eerld metrics tests (tests/ops) and the eerl-csi tests
(tests/eerld/csi) both serve: ``v1.PodResourcesLister/List`` on a Unix socket, answered by the test's
function."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc

from eerld.api.podresources import LIST_METHOD
from eerld.api.podresources import api_pb2 as pb

ListPods = Callable[[pb.ListPodResourcesRequest, grpc.ServicerContext], pb.ListPodResourcesResponse]


@contextmanager
def pod_resources_server(socket_path: Path, list_pods: ListPods) -> Iterator[grpc.Server]:
    """Serve ``List`` on ``socket_path`` with ``list_pods`` until the block ends (the server is yielded, so
    that a test can stop it early: the kubelet going away)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(
        list_pods,
        request_deserializer=pb.ListPodResourcesRequest.FromString,
        response_serializer=pb.ListPodResourcesResponse.SerializeToString,
    )
    service, method = LIST_METHOD.lstrip("/").split("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        yield server
    finally:
        server.stop(0)


__all__ = ["ListPods", "pod_resources_server"]
