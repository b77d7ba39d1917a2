"""Looking after boards rather than running models: which boards this PC reaches (devices), what is
broken between this PC and a board's NPU (doctor), and the commands a board runs over adb (shell)."""
