"""The daemon's Prometheus metrics, in a registry of its own (so that daemons and tests in one process
never share counters).

Events the daemon cannot see later (an RPC ending, a model run, a worker lost) are counted when they
happen; state the daemon already keeps (sessions, reservations, calls in flight, the model cache, board
telemetry) is read when Prometheus scrapes, so nothing else has to be instrumented. Metric names are
documented in docs/metrics-and-inference-protocol.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rknn_server.store.model_cache import ModelCache
from rknn_server.store.reservations import ReservationBook

# Run latencies from a tiny model on a fast NPU (~0.1 ms) to a large one on a slow CPU (~10 s).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Distinct model labels kept; later models share "other", so a client uploading many models cannot grow
# the daemon's memory (or Prometheus' series) without bound.
MAX_MODEL_LABELS = 64
OTHER_MODEL = "other"
# A model is labelled by the first characters of its digest, as in the logs.
MODEL_LABEL_CHARS = 12

disable_created_metrics()


class DaemonMetrics:
    """Everything one daemon exports on /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # The queue and compute series of each model label in use (at most MAX_MODEL_LABELS, then
        # OTHER_MODEL), kept: a doorbell observes every frame, and a label lookup costs as much as it.
        self._model_series: dict[str, tuple[Histogram, Histogram]] = {}
        self._doorbell_series: dict[str, Counter] = {}  # by status code name: a few
        # The series of each (method, outcome) seen (names of the daemon's own methods and status
        # codes, so few), and the byte series of each method that moved bytes.
        self._rpc_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._byte_series: dict[str, tuple[Counter, Counter]] = {}
        r = self.registry
        self.rpcs = Counter(
            "rknn_rpc", "RPCs finished, by method and status code", ["method", "outcome"], registry=r
        )
        self.rpc_seconds = Histogram(
            "rknn_rpc_duration_seconds",
            "RPC duration from its first message to its last, by method and status code",
            ["method", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter(
            "rknn_rpc_received_bytes", "Tensor and model bytes received, by method", ["method"], registry=r
        )
        self.bytes_out = Counter(
            "rknn_rpc_sent_bytes", "Tensor bytes sent, by method", ["method"], registry=r
        )
        self.queue_seconds = Histogram(
            "rknn_model_queue_seconds",
            "Time a model run waited for its session (calls into one session run one at a time) and, "
            "on the host runtime, for a run thread",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "rknn_model_compute_seconds",
            "Time the runtime took for a model run (inputs in to outputs out)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.workers_lost = Counter(
            "rknn_worker_lost",
            "Session worker processes killed or dead (--isolation process); their sessions are broken",
            ["reason"],
            registry=r,
        )
        self.doorbell_frames = Counter(
            "rknn_doorbell_frames",
            "Shared-memory frames rung on doorbells (server/protocols/local/doorbell.py: no gRPC call each), by outcome",
            ["code"],
            registry=r,
        )

    def rpc_done(self, method: str, outcome: str, seconds: float, bytes_in: int, bytes_out: int) -> None:
        series = self._rpc_series.get((method, outcome))
        if series is None:  # looking labels up costs more than counting: once per method and outcome
            series = self._rpc_series[method, outcome] = (
                self.rpcs.labels(method, outcome),
                self.rpc_seconds.labels(method, outcome),
            )
        series[0].inc()
        series[1].observe(seconds)
        if bytes_in or bytes_out:
            received, sent = self._byte_series.get(method) or self._byte_series.setdefault(
                method, (self.bytes_in.labels(method), self.bytes_out.labels(method))
            )
            if bytes_in:
                received.inc(bytes_in)
            if bytes_out:
                sent.inc(bytes_out)

    def model_run(self, digest: str, queue_s: float, compute_s: float) -> None:
        label = digest[:MODEL_LABEL_CHARS]
        series = self._model_series.get(label)
        if series is None:
            if len(self._model_series) >= MAX_MODEL_LABELS:
                label = OTHER_MODEL
            series = self._model_series.setdefault(
                label, (self.queue_seconds.labels(label), self.compute_seconds.labels(label))
            )
        queue, compute = series
        queue.observe(queue_s)
        compute.observe(compute_s)

    def doorbell_frame(self, code: str) -> None:
        counter = self._doorbell_series.get(code)
        if counter is None:
            counter = self._doorbell_series.setdefault(code, self.doorbell_frames.labels(code))
        counter.inc()

    def worker_lost(self, reason: str) -> None:
        self.workers_lost.labels(reason).inc()

    def watch(self, collector: Collector) -> None:
        """Add a collector read at scrape time."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """The text Prometheus scrapes."""
        return generate_latest(self.registry)


class StateCollector(Collector):
    """The daemon's own state, read at scrape time: sessions, reservations, calls in flight and refused,
    model cache."""

    def __init__(
        self,
        sessions: Callable[[], int],
        reservations: ReservationBook,
        inflight: Callable[[], Mapping[str, int]],
        refused: Callable[[], Mapping[str, int]],
        cache: ModelCache,
    ) -> None:
        self._sessions = sessions
        self._reservations = reservations
        self._inflight = inflight
        self._refused = refused
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("rknn_sessions_open", "Sessions (loaded models) open", value=self._sessions())
        yield GaugeMetricFamily(
            "rknn_reservation_held",
            "1 while a holder has reserved this device",
            value=int(self._reservations.current is not None),
        )
        yield GaugeMetricFamily(
            "rknn_reservation_waiters",
            "Clients queued for this device's reservation",
            value=self._reservations.waiting,
        )
        inflight = GaugeMetricFamily(
            "rknn_inflight_calls", "Calls being served, by client identity", labels=["client"]
        )
        for client, count in sorted(self._inflight().items()):
            inflight.add_metric([client], count)
        yield inflight
        refused = CounterMetricFamily(
            "rknn_rpc_refused",
            "Calls refused before a handler: no or a wrong token, or max_inflight_requests reached",
            labels=["outcome"],
        )
        for outcome, count in sorted(self._refused().items()):
            refused.add_metric([outcome], count)
        yield refused
        entries, size = cache_usage(self._cache.root / "models")
        yield GaugeMetricFamily("rknn_model_cache_entries", "Models in the cache", value=entries)
        yield GaugeMetricFamily("rknn_model_cache_bytes", "Bytes of the models in the cache", value=size)
        stats = self._cache.stats
        yield CounterMetricFamily(
            "rknn_model_cache_hits", "Uploads skipped because the model was already cached", value=stats.hits
        )
        yield CounterMetricFamily(
            "rknn_model_cache_stored", "Models uploaded and stored in the cache", value=stats.stored
        )
        yield CounterMetricFamily(
            "rknn_model_cache_evictions", "Models evicted to make room under the quota", value=stats.evictions
        )


def cache_usage(models: Path) -> tuple[int, int]:
    """(models, bytes) under the cache's models/ folder; a folder vanishing meanwhile is skipped."""
    entries = size = 0
    try:
        folders = list(models.iterdir())
    except OSError:
        return 0, 0
    for folder in folders:
        try:
            # Dot files are the cache's own markers, not the model.
            size += sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name[0] != ".")
        except OSError:
            continue
        entries += 1
    return entries, size


__all__ = ["DaemonMetrics", "StateCollector"]
