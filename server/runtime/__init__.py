"""Runtime backends behind one interface (see base): `host` (ONNX Runtime) and `rknnrt` (librknnrt)."""
