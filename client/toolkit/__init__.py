"""The bridge to the real RKNN-Toolkit2, which runs in an interpreter of its own.

    found = locate()                      # Toolkit, or Missing with the reason
    bridge = ToolkitBridge.start()        # a worker with an RKNN() in it, or Missing
    reply = bridge.call("build", do_quantization=True, dataset="dataset.txt")
    reply.ok, reply.value, reply.error, reply.lines
    bridge.close()                        # release() in the toolkit; the worker ends

See docs/toolkit-bridge.md.
"""

from rknn_client.toolkit.bridge import Reply, ToolkitBridge
from rknn_client.toolkit.locate import INSTALL_HINT, Missing, Toolkit, locate

__all__ = ["INSTALL_HINT", "Missing", "Reply", "Toolkit", "ToolkitBridge", "locate"]
