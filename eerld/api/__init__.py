"""The gRPC edge of eerld: validation and encoding, servicers, and the one error-mapping interceptor.

Nothing below this package imports grpc; nothing in it holds domain logic.
"""
