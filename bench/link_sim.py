"""A loopback TCP proxy that behaves like a cable: each direction limited to a bandwidth (full
duplex: the two directions do not share it) and delayed by a one-way latency.

    python -m bench.link_sim --target 127.0.0.1:50515 [--rate-mbps 35] [--latency-ms 1]

prints `listening on 127.0.0.1:PORT`. Benchmarks start it as its own process (`start_link`) so its
timing does not compete with the client for a Python interpreter lock. Bytes are moved in small
slices; each slice leaves when the link has finished sending the ones before it (bandwidth) and
arrives `latency` later. A bounded queue per direction stands in for the cable's buffering, so a
fast sender is slowed down by TCP flow control as it would be by a real link.
"""

from __future__ import annotations

import argparse
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

SLICE_BYTES = 16 << 10
# Slices buffered per direction (in the proxy, besides the kernel's socket buffers).
QUEUE_SLICES = 64
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LinkModel:
    bytes_per_s: float
    latency_s: float

    def describe(self) -> str:
        return f"full duplex, {self.bytes_per_s / 1e6:g} MB/s each way, {self.latency_s * 1e3:g} ms one-way latency"


# USB 2.0 high speed as boards' adb links achieve it in practice.
USB2 = LinkModel(bytes_per_s=35e6, latency_s=0.001)


class LinkClock:
    """When each slice arrives at the far end of one direction of the link."""

    def __init__(self, model: LinkModel) -> None:
        self._model = model
        self._free_at = 0.0

    def arrival(self, now: float, nbytes: int) -> float:
        """Arrival time of `nbytes` handed to the link at `now`: it starts once the link is free,
        takes nbytes / bandwidth to send, and lands `latency` after it is sent."""
        start = max(now, self._free_at)
        self._free_at = start + nbytes / self._model.bytes_per_s
        return self._free_at + self._model.latency_s


def _pump(source: socket.socket, sink: socket.socket, model: LinkModel) -> None:
    """Carry one direction: a reader thread timestamps slices, this thread delivers them on time."""
    slices: queue.Queue[tuple[float, bytes] | None] = queue.Queue(QUEUE_SLICES)
    clock = LinkClock(model)

    def read() -> None:
        try:
            while data := source.recv(SLICE_BYTES):
                slices.put((clock.arrival(time.monotonic(), len(data)), data))
        except OSError:
            pass
        slices.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while (item := slices.get()) is not None:
            due, data = item
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        source.close()


def _connection(client: socket.socket, target: tuple[str, int], model: LinkModel) -> None:
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client, model), daemon=True)
    back.start()
    _pump(client, upstream, model)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, target: tuple[str, int], model: LinkModel) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_connection, args=(client, target, model), daemon=True).start()


@dataclass
class LinkProcess:
    process: subprocess.Popen[str]
    address: str  # "127.0.0.1:PORT"

    @property
    def url(self) -> str:
        return f"tcp://{self.address}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_link(target: str, model: LinkModel = USB2) -> LinkProcess:
    """Run the proxy in front of `target` ("HOST:PORT") as a subprocess; stop it with .stop()."""
    cmd = [
        sys.executable,
        "-m",
        "bench.link_sim",
        "--target",
        target,
        "--rate-mbps",
        str(model.bytes_per_s / 1e6),
        "--latency-ms",
        str(model.latency_s * 1e3),
    ]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        raise RuntimeError(f"the link simulator did not start (said {line!r})")
    return LinkProcess(process, line.strip().removeprefix("listening on "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--listen-port", type=int, default=0, help="loopback port (0: a free one)")
    parser.add_argument("--rate-mbps", type=float, default=USB2.bytes_per_s / 1e6, help="MB/s each way")
    parser.add_argument("--latency-ms", type=float, default=USB2.latency_s * 1e3, help="one-way latency")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    model = LinkModel(args.rate_mbps * 1e6, args.latency_ms / 1e3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.create_server(("127.0.0.1", args.listen_port))
    print(f"listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    serve(listener, (host, int(port)), model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
