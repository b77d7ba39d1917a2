"""rknn_client: the PC side of rknn_server.

`connect()` is the idiomatic API; `RKNN` and `RKNNLite` are drop-in replacements for
RKNN-Toolkit2's and rknn-toolkit-lite2's classes (change one import line). They are imported at
first use (rknn_client.lazy), so `import rknn_client` works where only the `[server]` extra is.
"""

from typing import TYPE_CHECKING

from rknn_client.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from rknn_client.compat.lite import RKNNLite
    from rknn_client.compat.rknn import RKNN
    from rknn_client.device import Device, connect
    from rknn_client.frame_spec import FrameSpec
    from rknn_client.session import Session

__all__ = ["RKNN", "Device", "FrameSpec", "RKNNLite", "Session", "__version__", "connect"]
__getattr__ = lazy_exports(
    __name__,
    {
        "Device": "rknn_client.device",
        "FrameSpec": "rknn_client.frame_spec",
        "Session": "rknn_client.session",
        "connect": "rknn_client.device",
        "RKNNLite": "rknn_client.compat.lite",
        "RKNN": "rknn_client.compat.rknn",
    },
)
