"""How the client reaches a daemon: tcp, adb, or a private host-runtime daemon it starts itself."""
