"""Generated gRPC code of the eerl.v1 contract (proto/eerl/v1/eerl.proto). Do not edit: run `make proto`."""
