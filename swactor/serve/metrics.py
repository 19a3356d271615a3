"""The server's metrics in Prometheus text exposition format (version 0.0.4).

Theory of operation: a handful of counters, gauges and histograms kept in plain Python
numbers by the one event loop that serves requests (no locks), rendered on each
``GET /metrics``. Label values are chosen by the server from closed sets (endpoint
paths it routes, HTTP status codes, finish reasons), never from request contents, so the
number of series is bounded.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATE_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Labels, extra: Labels = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self._values[key] = self._values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        values = self._values or {(): 0.0}
        lines += [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(values.items())]
        return lines


class Gauge:
    """A value read when rendered (``kind="counter"`` for a total kept elsewhere)."""

    def __init__(
        self, name: str, help_text: str, read: Callable[[], float], kind: str = "gauge"
    ) -> None:
        self.name, self.help, self._read, self._kind = name, help_text, read, kind

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} {self._kind}",
            f"{self.name} {_number(self._read())}",
        ]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help_text
        self._bounds = tuple(buckets)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip((*self._bounds, math.inf), self._counts, strict=True):
            running += count
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {running}')
        lines.append(f"{self.name}_sum {_number(self._sum)}")
        lines.append(f"{self.name}_count {running}")
        return lines


class ServeMetrics:
    """Every metric ``GET /metrics`` shows."""

    def __init__(
        self, in_flight: Callable[[], float], queued: Callable[[], float],
        restarts: Callable[[], float],
    ) -> None:
        p = "swactor_serve_"
        self.requests = Counter(p + "requests_total", "HTTP requests answered, by path and status.")
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "Prompt tokens admitted.")
        self.completion_tokens = Counter(
            p + "completion_tokens_total", "Tokens generated for clients."
        )
        self.finished = Counter(p + "sequences_finished_total", "Sequences ended, by reason.")
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "From request arrival to the first generated token.", LATENCY_BUCKETS,
        )
        self.inter_token = Histogram(
            p + "inter_token_seconds", "Between consecutive generated tokens.", LATENCY_BUCKETS
        )
        self.queue_time = Histogram(
            p + "queue_seconds", "From request arrival to admission into a slot.",
            LATENCY_BUCKETS,
        )
        self.decode_rate = Histogram(
            p + "decode_tokens_per_second", "Per request: tokens after the first per second.",
            RATE_BUCKETS,
        )
        self._gauges = [
            Gauge(p + "sequences_in_flight", "Sequences submitted to the engine.", in_flight),
            Gauge(p + "requests_queued", "Requests waiting for a slot.", queued),
            Gauge(
                p + "run_restarts_total", "Runs provisioned again after a fault.", restarts,
                kind="counter",
            ),
        ]

    def render(self) -> str:
        lines: list[str] = []
        for metric in (
            self.requests, self.prompt_tokens, self.completion_tokens, self.finished,
            self.ttft, self.inter_token, self.queue_time, self.decode_rate,
        ):
            lines += metric.render()
        for gauge in self._gauges:
            lines += gauge.render()
        return "\n".join(lines) + "\n"
