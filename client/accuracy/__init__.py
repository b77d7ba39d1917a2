"""Accuracy analysis on the PC: quantization emulation, per-layer capture, the layer-by-layer error report.

Entry points: `build.build_models` (config/build: mean/std baked in, int8 QDQ as the toolkit quantizes,
run by ONNX Runtime: `quantize`, `fusion`, `calibrate`),
`analysis.analyse` (golden/simulator/runtime comparison written to output_dir), `capture.run_capture`
(every layer of a model), `preprocess.load_inputs` (the toolkit's input files as arrays). Every bad
input raises `errors.AccuracyError`.
"""
