"""The one place where domain errors become gRPC status codes (and where RPC latency is observed).

Servicers let :mod:`eerld.errors` exceptions fly; this interceptor maps each branch of the tree to one
status code with the error's message (which names the field or the holder). Anything outside the tree is
a bug: the client gets INTERNAL with a generic message, the log gets the traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from eerld.daemon.views import RpcObserver
from eerld.errors import (
    BackendFailure,
    ConfigError,
    Conflict,
    DaemonError,
    Exhausted,
    GpuError,
    GpuLost,
    NotFound,
    PermissionDenied,
    Unavailable,
    ValidationError,
)

log = structlog.get_logger("eerld.api")

OWN_SERVICES_PREFIX = "/eerl.v1."
TARPIT_S = 1.0
"""A caller over its rate bound waits this long for its refusal, so that a loop of refused calls is slow."""
MAX_TARPIT_SLOTS = 8
"""Refusals of one socket held back at once (more are answered at once): the tarpit costs at most this
many of the socket's own threads (and at most a quarter of them)."""
INTERNAL_MESSAGE = "internal error in eerld; the daemon's log has the details"


def status_code_for(error: DaemonError) -> grpc.StatusCode:
    """The gRPC status code of a domain error."""
    if isinstance(error, ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, Conflict | ConfigError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(error, Exhausted):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, Unavailable | GpuLost | BackendFailure):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, GpuError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


class _Undecodable:
    """Stands in for a request whose bytes are not a valid message (gRPC would answer INTERNAL)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Wrap a request deserializer so that garbage bytes reach the handler as :class:`_Undecodable`."""
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:
            return _Undecodable(e)

    return decode


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise ValidationError("request", f"not a valid protobuf message of this RPC ({request.error})")


if TYPE_CHECKING:  # the stubs make ServerInterceptor generic; the runtime class is not subscriptable
    _InterceptorBase = grpc.ServerInterceptor[Any, Any]
else:
    _InterceptorBase = grpc.ServerInterceptor


class ErrorMappingInterceptor(_InterceptorBase):
    """Wraps eerl.v1 handlers: maps errors to status codes and reports each RPC to ``on_rpc``.

    One instance per server, built with the services that server serves: a method of any other service is
    answered UNIMPLEMENTED before any handler is looked up, and the cache of wrapped handlers belongs to
    this server alone. (A cache shared by the worker and admin servers once served admin methods on the
    worker socket after their first call on the admin socket.)
    """

    def __init__(self, on_rpc: RpcObserver, services: Iterable[str], *, workers: int = 8) -> None:
        self._on_rpc = on_rpc
        self._prefixes = tuple(f"/{name}/" for name in services)
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._tarpit = threading.BoundedSemaphore(max(1, min(MAX_TARPIT_SLOTS, workers // 4)))

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        if not method.startswith(self._prefixes):
            return None
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if handler is None or not method.startswith(OWN_SERVICES_PREFIX):
            return handler
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        name = method.rsplit("/", 1)[-1]
        deserializer = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler.unary_unary),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(name, handler.unary_stream),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, name: str, inner: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                _check_decoded(request)
                return inner(request, context)
            except Exception as e:
                code, message = self._map(name, e)
                if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self._hold_back()
                context.abort(code, message)
            finally:
                self._observe(name, code, time.perf_counter() - start)

        return call

    def _hold_back(self) -> None:
        """Delay a rate-bound refusal (a client that loops on refused calls then costs next to nothing)."""
        if self._tarpit.acquire(blocking=False):
            try:
                time.sleep(TARPIT_S)
            finally:
                self._tarpit.release()

    def _stream(
        self, name: str, inner: Callable[[Any, grpc.ServicerContext], Iterator[Any]]
    ) -> Callable[..., Iterator[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                _check_decoded(request)
                yield from inner(request, context)
            except Exception as e:
                code, message = self._map(name, e)
                context.abort(code, message)
            finally:
                self._observe(name, code, time.perf_counter() - start)

        return call

    @staticmethod
    def _map(name: str, error: Exception) -> tuple[grpc.StatusCode, str]:
        if isinstance(error, DaemonError):
            code = status_code_for(error)
            if code is not grpc.StatusCode.INTERNAL:
                log.debug("rpc_rejected", method=name, code=code.name, error=str(error))
                return code, str(error)
        log.error("rpc_internal_error", method=name, exc_info=error)
        return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE

    def _observe(self, name: str, code: grpc.StatusCode, duration_s: float) -> None:
        try:
            self._on_rpc(name, code.name, duration_s)
        except Exception:
            log.exception("rpc_observer_error")


class StreamGuardInterceptor(_InterceptorBase):
    """Bounds the streams a socket's callers may hold open: at most ``limit`` at once, each ``lifetime_s``.

    A stream holds one of the server's worker threads for as long as it is open, so about 130 reflection
    calls that never sent a request once starved every other caller of the socket. ``exempt`` methods
    (Attach: one per open session, bound to the session's life) are left alone.
    """

    def __init__(self, limit: int, lifetime_s: float, *, exempt: Iterable[str] = ()) -> None:
        self._limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._lifetime_s = lifetime_s
        self._exempt = frozenset(exempt)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method in self._exempt:
            return handler
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._guard(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._guard(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _guard(
        self, inner: Callable[[Any, grpc.ServicerContext], Iterator[Any]]
    ) -> Callable[..., Iterator[Any]]:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if not self._slots.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this socket serves at most {self._limit} streams at once; retry later",
                )
            timer = threading.Timer(self._lifetime_s, context.cancel)
            timer.daemon = True
            timer.start()
            try:
                yield from inner(request, context)
            finally:
                timer.cancel()
                self._slots.release()

        return call
