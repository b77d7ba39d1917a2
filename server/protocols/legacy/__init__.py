"""The closed RKNN-Toolkit2 protocol, so an unmodified toolkit on the PC drives this daemon through adb.

It is a second front end over the same data plane as the gRPC service (`rknn_server.core.data_plane`): the
same model cache, session registry, limits and runtimes. See docs/legacy-protocol.md.
"""
