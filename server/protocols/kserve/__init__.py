"""The open inference protocol (KServe v2) beside rknn.v1, on the same data plane.

`models` is the protocol-neutral part both transports share (model lookup by name and version, the
per-caller session cache, the tensor intake, metadata); `repository` reads the --model-repository
folder; `grpc_service` and `rest` translate the gRPC and HTTP/REST forms of the protocol.
"""
