"""The machine the daemon runs on: its SoC and frequencies, its telemetry, who owns a local connection, its allocator."""
