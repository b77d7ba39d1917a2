"""Peer servers for `make bench` (issue 32): KServe, MLServer and PyTriton in venvs of their own,
serving the same ONNX models on the same ONNX Runtime as our daemon, driven by the same tritonclient."""
