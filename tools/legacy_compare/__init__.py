"""Rockchip's real rknn_server against ours, driven by the unmodified toolkit, message by message (README.md)."""
