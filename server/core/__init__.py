"""The data plane: sessions, the frame intake, the memory budget, shared-memory regions."""
