"""Server reflection under both names clients use: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection ships only the v1alpha service, while grpcurl and recent tools ask for v1 first. The two
services are the same messages under another package name (the wire format is identical), so the v1alpha
servicer answers both.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
REFLECTION_SERVICES = (V1_SERVICE, reflection.SERVICE_NAME)


def enable_reflection(service_names: Iterable[str], server: grpc.Server) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names``."""
    names = tuple(service_names)
    reflection.enable_server_reflection(names, server)
    servicer = reflection.ReflectionServicer(names)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
