"""rknn.v1 over gRPC: the service, its frame pipelines, uploads."""
