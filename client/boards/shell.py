"""Commands on a board over `adb shell`, for the tools that inspect or set one up (doctor, devices, deploy)."""

from __future__ import annotations

from dataclasses import dataclass

import adbutils

SHELL_SECONDS = 15.0


@dataclass(frozen=True)
class ShellResult:
    code: int
    output: str  # stdout and stderr together (legacy adb shell merges them)

    @property
    def ok(self) -> bool:
        return self.code == 0


class BoardShell:
    """adb shell on one board."""

    def __init__(self, device: adbutils.AdbDevice) -> None:
        self.device = device

    def output(self, command: str, timeout: float = SHELL_SECONDS) -> str:
        """The command's output, or '' when it cannot run at all."""
        try:
            return str(self.device.shell(command, timeout=timeout))
        except adbutils.AdbError:
            return ""

    def run(self, command: str, timeout: float = SHELL_SECONDS) -> ShellResult:
        """The command's exit code and output; raises adbutils.AdbError when adb itself fails."""
        result = self.device.shell2(command, timeout=timeout, rstrip=True)
        return ShellResult(int(result.returncode), str(result.output))
