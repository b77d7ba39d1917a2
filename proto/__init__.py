"""The wire contract shared by the board daemon and the PC client.

`rknn_pb2` / `rknn_pb2_grpc` are generated from `rknn.proto` (see tools/gen_proto.py);
`codec` turns numpy arrays into chunked tensor messages and back; `manifest` computes a model's
content address; `version` holds the protocol version and the project's constants.
"""
