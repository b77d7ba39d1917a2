"""What the daemon reports: metrics, call records, logs."""
