"""Same-host frames: RunShared over shared memory, doorbells on a unix socket."""
