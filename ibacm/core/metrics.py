"""Optional Prometheus/OpenMetrics endpoint (option ``metrics_port``, extra ``ibacm[metrics]``).

Three sources feed one private ``CollectorRegistry``, served by ``serve_metrics``:

* ``SnapshotCollector`` reads the daemon's admin snapshot (``DaemonControl.snapshot()``,
  schema in ``docs/admin-protocol.md``) at each scrape: the ACM counters globally and
  per endpoint, cache entries and multicast groups by state, addresses, ports and their SA
  queues, clients and uptime;
* ``MadMetrics`` is a ``MadObserver`` for ``ibacm.fabric.capture.TapFabric``: MADs by
  direction, class, method and attribute, and the SA round-trip latency histogram;
* prometheus_client's ``ProcessCollector``: the ``process_*`` series of the daemon process
  (CPU, memory, file descriptors, start time; Linux /proc).

``serve_metrics`` is a small trio HTTP server (``GET /metrics``) that answers in the
Prometheus text format or, when the scraper asks for it, in OpenMetrics.

The endpoint listens on 127.0.0.1 by default: it tells who resolves what, so exposing it
wider is an explicit choice.
"""

from __future__ import annotations

import enum
import math
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import trio

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        InfoMetricFamily,
        Metric,
    )
except ImportError as exc:  # the optional extra is missing: say how to get it
    raise ImportError(
        "ibacm metrics need prometheus_client: install 'ibacm[metrics]' "
        "(pip install prometheus_client)"
    ) from exc

from ibacm.fabric.capture import MadTrace, SaExchange, SaOutcome
from ibacm.log import get_logger
from ibacm.wire.counters import Counter as AcmCounter

log = get_logger("ibacm.metrics")

DEFAULT_HOST = "127.0.0.1"
METRICS_PATH = "/metrics"
MAX_REQUEST_HEAD = 16 * 1024
"""Bytes of request line plus headers a scraper may send."""
REQUEST_TIMEOUT = 10.0
"""Seconds a connection may take to send its request."""
MAX_CONNECTIONS = 16
SA_LATENCY_BUCKETS = (
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
)
"""Seconds; umad's default is 2 s per attempt times 3 attempts."""

SnapshotFn = Callable[[], Mapping[str, Any]]


class MetricsError(Exception):
    """The metrics endpoint cannot be served (e.g. the port is taken)."""


# -- MADs and SA latency ------------------------------------------------------------------------


class MadMetrics:
    """A ``MadObserver``: counts every MAD and times every SA request."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.mads = Counter(
            "ibacm_mads",
            "MADs sent and received, by direction, management class, method and attribute",
            ["direction", "mgmt_class", "method", "attribute"],
            registry=registry,
        )
        self.sa_latency = Histogram(
            "ibacm_sa_request_duration_seconds",
            "Time from sending an SA request to its answer (umad retries included)",
            ["attribute"],
            buckets=SA_LATENCY_BUCKETS,
            registry=registry,
        )
        self.sa_failures = Counter(
            "ibacm_sa_failures",
            "SA requests that got no answer, by attribute and reason",
            ["attribute", "reason"],
            registry=registry,
        )
        self.sa_status = Counter(
            "ibacm_sa_answers",
            "SA answers by attribute and MAD status word (0x0000 = success)",
            ["attribute", "status"],
            registry=registry,
        )

    def on_mad(self, trace: MadTrace) -> None:
        kind = trace.kind
        self.mads.labels(trace.direction.value, kind.mgmt_class, kind.method, kind.attribute).inc()

    def on_sa_exchange(self, exchange: SaExchange) -> None:
        attribute = exchange.kind.attribute
        if exchange.outcome is SaOutcome.OK:
            self.sa_latency.labels(attribute).observe(max(0.0, exchange.latency))
            status = exchange.status if exchange.status is not None else 0
            self.sa_status.labels(attribute, f"0x{status:04x}").inc()
        else:
            self.sa_failures.labels(attribute, exchange.outcome.value).inc()


# -- the daemon snapshot ------------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in a snapshot list (anything else is skipped: readers must be lenient)."""
    if not isinstance(value, list | tuple):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _counters(value: Any) -> list[float]:
    """The ACM counters of a snapshot entry, or [] when absent or malformed."""
    if not isinstance(value, list | tuple) or len(value) < len(AcmCounter):
        return []
    numbers = [_number(v) for v in value[: len(AcmCounter)]]
    return [] if any(n is None for n in numbers) else [n for n in numbers if n is not None]


class SnapshotCollector:
    """A prometheus_client collector that turns one daemon snapshot into metric families."""

    def __init__(self, snapshot_fn: SnapshotFn) -> None:
        self._snapshot_fn = snapshot_fn

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on the snapshot; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        ok = GaugeMetricFamily(
            "ibacm_snapshot_ok", "1 when the daemon state could be read for this scrape"
        )
        try:
            snapshot = _mapping(self._snapshot_fn())
        except Exception as exc:  # one failed scrape must not stop the endpoint
            log.warning("daemon snapshot for metrics failed", error=str(exc) or repr(exc))
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        yield from self._daemon(_mapping(snapshot.get("daemon")))
        yield from self._global_counters(snapshot.get("counters"))
        yield from self._endpoints(_items(snapshot.get("endpoints")))
        yield from self._ports(_items(snapshot.get("ports")))

    def _daemon(self, daemon: Mapping[str, Any]) -> Iterator[Metric]:
        info = InfoMetricFamily(
            "ibacm", "ibacm daemon version and node", labels=["version", "node"]
        )
        info.add_metric([str(daemon.get("version", "")), str(daemon.get("node", ""))], {})
        yield info
        for key, name, text in (
            ("uptime", "ibacm_uptime_seconds", "Seconds since the daemon started"),
            ("clients", "ibacm_clients", "Connected ACM clients"),
            ("log_level", "ibacm_log_level", "Current log_level option (0..2)"),
        ):
            value = _number(daemon.get(key))
            if value is not None:
                yield GaugeMetricFamily(name, text, value=value)
        yield from self._client_limits(_mapping(daemon.get("client_limits")))
        yield from self._losses(daemon)

    def _client_limits(self, limits: Mapping[str, Any]) -> Iterator[Metric]:
        """What the client limits refused and closed (admin snapshot ``client_limits``)."""
        for name, text, reasons in (
            (
                "ibacm_clients_refused",
                "Client connections refused at a limit",
                (("refused_total", "max_clients"), ("refused_user", "max_clients_per_user")),
            ),
            (
                "ibacm_clients_timed_out",
                "Client connections closed by a timeout",
                (("request_timeouts", "request"), ("idle_timeouts", "idle")),
            ),
            (
                "ibacm_clients_closed",
                "Client connections closed for misbehaving",
                (("malformed", "malformed_request"), ("dropped", "unread_replies")),
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["reason"])
            for key, reason in reasons:
                value = _number(limits.get(key))
                if value is not None:
                    family.add_metric([reason], value)
            if family.samples:
                yield family

    def _losses(self, daemon: Mapping[str, Any]) -> Iterator[Metric]:
        """What files that could not be written cost (admin snapshot ``log`` and ``capture``)."""
        lost = _number(_mapping(daemon.get("log")).get("lost"))
        if lost is not None:
            yield CounterMetricFamily(
                "ibacm_log_lines_lost", "Log lines that could not be written", value=lost
            )
        capture = _mapping(daemon.get("capture"))
        family = CounterMetricFamily(
            "ibacm_capture_records_lost",
            "MADs of the current (or last) capture that are not in its file",
            labels=["reason"],
        )
        for key, reason in (("dropped", "queue_full"), ("lost", "write_failed")):
            value = _number(capture.get(key))
            if value is not None:
                family.add_metric([reason], value)
        if family.samples:
            yield family

    def _global_counters(self, raw: Any) -> Iterator[Metric]:
        values = _counters(raw)
        for counter, value in zip(AcmCounter, values, strict=False):
            yield CounterMetricFamily(f"ibacm_{counter.key}", counter.description, value=value)

    def _endpoints(self, endpoints: list[Mapping[str, Any]]) -> Iterator[Metric]:
        labels = ["endpoint"]
        counters = {
            counter: CounterMetricFamily(
                f"ibacm_endpoint_{counter.key}",
                f"{counter.description}, per endpoint",
                labels=labels,
            )
            for counter in AcmCounter
        }
        cache = GaugeMetricFamily(
            "ibacm_cache_entries",
            "Cache entries per endpoint and state",
            labels=["endpoint", "state"],
        )
        groups = GaugeMetricFamily(
            "ibacm_groups", "Multicast groups per endpoint and state", labels=["endpoint", "state"]
        )
        addresses = GaugeMetricFamily(
            "ibacm_endpoint_addresses", "Addresses served by each endpoint", labels=labels
        )
        for endpoint in endpoints:
            ident = str(endpoint.get("id", "?"))
            for counter, value in zip(
                AcmCounter, _counters(endpoint.get("counters")), strict=False
            ):
                counters[counter].add_metric([ident], value)
            for state, count in sorted(_cache_states(endpoint).items()):
                cache.add_metric([ident, state], count)
            for state, count in sorted(_states(endpoint.get("groups")).items()):
                groups.add_metric([ident, state], count)
            addresses.add_metric([ident], len(_items(endpoint.get("addresses"))))
        yield from counters.values()
        yield from (cache, groups, addresses)

    def _ports(self, ports: list[Mapping[str, Any]]) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "ibacm_port_active", "1 when the port is ACTIVE", labels=["port"]
        )
        gauges = {
            key: GaugeMetricFamily(f"ibacm_port_sa_{key}", text, labels=["port"])
            for key, text in (
                ("in_flight", "SA requests outstanding on the port"),
                ("waiting", "SA requests queued behind the sa_depth credits"),
            )
        }
        totals = {
            key: CounterMetricFamily(f"ibacm_port_sa_{key}", text, labels=["port"])
            for key, text in (
                ("sent", "SA requests sent on the port"),
                ("failed", "SA requests on the port that failed"),
            )
        }
        for port in ports:
            ident = str(port.get("id", "?"))
            active.add_metric([ident], 1 if port.get("state") == "ACTIVE" else 0)
            sa = _mapping(port.get("sa"))
            for key, gauge in gauges.items():
                value = _number(sa.get(key))
                if value is not None:
                    gauge.add_metric([ident], value)
            for key, total in totals.items():
                value = _number(sa.get(key))
                if value is not None:
                    total.add_metric([ident], value)
        yield active
        yield from gauges.values()
        yield from totals.values()


def _states(entries: Any) -> Tally[str]:
    """How many entries of a snapshot list are in each ``state``."""
    return Tally(str(entry.get("state", "unknown")) for entry in _items(entries))


def _cache_states(endpoint: Mapping[str, Any]) -> Tally[str]:
    """Cache entries by state: the documented ``cache`` list, a provider's ``entries`` list,
    or only a ``cache_entries`` count (then all of them are in state "unknown")."""
    for key in ("cache", "entries"):
        if isinstance(endpoint.get(key), list | tuple):
            return _states(endpoint[key])
    count = _number(endpoint.get("cache_entries"))
    return Tally({"unknown": int(count)}) if count else Tally()


# -- what the endpoint serves -------------------------------------------------------------------


class DaemonMetrics:
    """The registry of one daemon: its snapshot plus the MAD observer to hang on the tap."""

    def __init__(self, snapshot_fn: SnapshotFn | None = None) -> None:
        self.registry = CollectorRegistry()
        # The client library's process_* series (CPU seconds, resident and virtual memory,
        # open and maximum file descriptors, start time), read from /proc/self at each scrape.
        ProcessCollector(registry=self.registry)
        self.mads = MadMetrics(self.registry)
        if snapshot_fn is not None:
            self.registry.register(SnapshotCollector(snapshot_fn))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its content type, chosen by the ``Accept`` header."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


# -- HTTP ---------------------------------------------------------------------------------------


class HttpStatus(enum.IntEnum):
    OK = 200
    BAD_REQUEST = 400
    NOT_FOUND = 404
    METHOD_NOT_ALLOWED = 405
    REQUEST_TIMEOUT = 408
    HEADERS_TOO_LARGE = 431
    INTERNAL_ERROR = 500


_REASONS = {
    HttpStatus.OK: "OK",
    HttpStatus.BAD_REQUEST: "Bad Request",
    HttpStatus.NOT_FOUND: "Not Found",
    HttpStatus.METHOD_NOT_ALLOWED: "Method Not Allowed",
    HttpStatus.REQUEST_TIMEOUT: "Request Timeout",
    HttpStatus.HEADERS_TOO_LARGE: "Request Header Fields Too Large",
    HttpStatus.INTERNAL_ERROR: "Internal Server Error",
}


class HttpError(Exception):
    def __init__(self, status: HttpStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str
    headers: Mapping[str, str]

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def parse_request_head(head: bytes) -> HttpRequest:
    """Parse an HTTP/1.x request line and headers (without the blank line); pure."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(HttpStatus.BAD_REQUEST, "request is not text") from exc
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise HttpError(HttpStatus.BAD_REQUEST, f"malformed request line {lines[0][:80]!r}")
    method, target, version = parts
    if not version.startswith("HTTP/1."):
        raise HttpError(HttpStatus.BAD_REQUEST, f"unsupported protocol {version[:20]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(HttpStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return HttpRequest(method, target, headers)


def http_response(
    status: HttpStatus, body: bytes, content_type: str, *, head_only: bool = False
) -> bytes:
    """A complete HTTP/1.1 response that closes the connection."""
    lines = [
        f"HTTP/1.1 {int(status)} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == HttpStatus.METHOD_NOT_ALLOWED:
        lines.append("Allow: GET, HEAD")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def answer(metrics: DaemonMetrics, request: HttpRequest) -> bytes:
    """The response to one parsed request."""
    if request.method not in ("GET", "HEAD"):
        return _error(HttpStatus.METHOD_NOT_ALLOWED, f"method {request.method} not allowed")
    if request.path not in (METRICS_PATH, "/"):
        return _error(HttpStatus.NOT_FOUND, f"no such resource {request.path!r}; try /metrics")
    body, content_type = metrics.render(request.headers.get("accept"))
    return http_response(HttpStatus.OK, body, content_type, head_only=request.method == "HEAD")


def _error(status: HttpStatus, message: str) -> bytes:
    return http_response(status, (message + "\n").encode(), "text/plain; charset=utf-8")


async def _read_head(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_REQUEST_HEAD:
            raise HttpError(HttpStatus.HEADERS_TOO_LARGE, "request head too large")
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise HttpError(HttpStatus.BAD_REQUEST, "connection closed before the request ended")
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    if len(head) > MAX_REQUEST_HEAD:
        raise HttpError(HttpStatus.HEADERS_TOO_LARGE, "request head too large")
    return head


async def _serve_connection(
    metrics: DaemonMetrics,
    limiter: trio.CapacityLimiter,
    timeout: float,
    stream: trio.SocketStream,
) -> None:
    async with stream, limiter:
        try:
            with trio.fail_after(timeout):
                request = parse_request_head(await _read_head(stream))
            response = answer(metrics, request)
        except HttpError as exc:
            response = _error(exc.status, exc.message)
        except trio.TooSlowError:
            response = _error(HttpStatus.REQUEST_TIMEOUT, "request not received in time")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except Exception as exc:  # a bug answers 500 to this scraper, the endpoint goes on
            log.exception("metrics request failed")
            response = _error(HttpStatus.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
        try:
            with trio.move_on_after(timeout):
                await stream.send_all(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def serve_metrics(
    port: int,
    metrics: DaemonMetrics,
    *,
    host: str = DEFAULT_HOST,
    request_timeout: float = REQUEST_TIMEOUT,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` on ``host:port`` until cancelled; ``task_status`` gets the port.

    ``port`` 0 picks a free port (tests). A connection has ``request_timeout`` seconds to
    send its request and to take the answer. Raises MetricsError before ``started`` when the
    address cannot be bound.
    """
    if not 0 <= port <= 0xFFFF:
        raise MetricsError(f"metrics port {port} is out of range 0..65535")
    if not request_timeout > 0:
        raise MetricsError(f"request_timeout must be > 0 seconds, got {request_timeout}")
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise MetricsError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    bound = listeners[0].socket.getsockname()[1]
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(metrics, limiter, request_timeout, stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        log.info("metrics endpoint listening", host=host, port=bound)
        task_status.started(bound)


__all__ = [
    "DEFAULT_HOST",
    "METRICS_PATH",
    "SA_LATENCY_BUCKETS",
    "DaemonMetrics",
    "HttpError",
    "HttpRequest",
    "HttpStatus",
    "MadMetrics",
    "MetricsError",
    "SnapshotCollector",
    "answer",
    "http_response",
    "parse_request_head",
    "serve_metrics",
]
