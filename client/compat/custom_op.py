"""`rknn.api.custom_op`: the helper custom-operator classes call to read their ONNX node's attributes.

Registering a custom operator (`RKNN.reg_custom_op`) needs RKNN-Toolkit2 itself; this module exists so
that a script defining its operator classes imports and runs up to that call.
"""

from __future__ import annotations

from typing import Any

import onnx


def get_node_attr(node: onnx.NodeProto, attr_name: str) -> Any:
    """The value of the node's attribute `attr_name` (bytes decoded to str), or None when it has none."""
    for attribute in node.attribute:
        if attribute.name == attr_name:
            value = onnx.helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else value
    return None
