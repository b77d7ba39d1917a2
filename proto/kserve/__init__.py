"""The open inference protocol (KServe v2) as this daemon serves it: `grpc_service.proto` and its
generated modules (tools/gen_proto.py)."""
