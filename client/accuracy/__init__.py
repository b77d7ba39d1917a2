"""Accuracy analysis on the PC: quantization emulation, per-layer capture and the layer-by-layer error report."""
