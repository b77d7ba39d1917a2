"""Protocol version and the constants both sides must agree on."""

from __future__ import annotations

# Minor version of the rknn.v1 contract: bumped each time a field or RPC is added.
PROTOCOL_VERSION = 7
# First protocol version with the unary Run RPC.
RUN_RPC_VERSION = 6
# First protocol version whose Run answers outputs of any size up to MAX_RUN_REPLY_BYTES (and refuses
# larger ones before computing wherever their size is known): outputs of unknown size may go unary.
UNBOUNDED_RUN_VERSION = 7
# Oldest peer version this code still talks to.
MIN_PROTOCOL_VERSION = 1
# gRPC metadata key carrying the sender's PROTOCOL_VERSION on every call.
PROTOCOL_VERSION_METADATA_KEY = "rknn-protocol-version"
# gRPC metadata key carrying a device reservation's token (see Reserve in rknn.proto).
RESERVATION_METADATA_KEY = "rknn-reservation"

# The project's default TCP port.
DEFAULT_PORT = 50515
# The abstract UNIX socket the daemon listens on by default (reached over adb forward).
DEFAULT_ABSTRACT_SOCKET = "rknn_server"

# Chunk size for tensors and model uploads: about 1 MiB measured fastest in Python gRPC.
CHUNK_BYTES = 1 << 20
# Largest single gRPC message either side accepts: a chunk plus generous framing room.
MAX_MESSAGE_BYTES = 8 << 20
# Largest unary Run reply the daemon sends and the client (which trusts its daemon) accepts: one
# protobuf message's hard limit, so a Run whose outputs were computed is never refused for their size.
MAX_RUN_REPLY_BYTES = (2 << 30) - 1
# HTTP/2 frames up to the protocol's largest size (16 MiB - 1) where gRPC announces 16 KiB: a 4 MiB
# chunk is read as one frame instead of 256 (measured here: about a tenth less daemon CPU per
# uploaded GiB). Both sides' channel options.
HTTP2_OPTIONS = (("grpc.http2.max_frame_size", (16 << 20) - 1),)
