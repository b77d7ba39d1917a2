"""Same-host frames: tensors in shared memory (shared_memory.py) rung on a doorbell (doorbell.py)."""
