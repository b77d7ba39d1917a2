"""Accuracy analysis on the PC: quantization emulation, per-layer capture, the layer-by-layer error report."""
