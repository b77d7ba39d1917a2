"""rknn_server: the board daemon that lets a PC run, profile and inspect models on an RKNN NPU."""

__version__ = "0.1.0"
