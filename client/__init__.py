"""rknn_client: the PC side of rknn_server.

`connect()` is the idiomatic API; `RKNN` and `RKNNLite` are drop-in replacements for
RKNN-Toolkit2's and rknn-toolkit-lite2's classes (change one import line).
"""

__version__ = "0.1.0"

from rknn_client.api import Device, Session, connect
from rknn_client.compat.lite import RKNNLite
from rknn_client.compat.rknn import RKNN

__all__ = ["RKNN", "Device", "RKNNLite", "Session", "__version__", "connect"]
