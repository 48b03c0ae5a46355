"""Metrics through OpenTelemetry's API (the ``otel`` extra); nothing at all without it.

Instruments of the meter ``aiolock`` (attribute ``lock.type``: lock, fenced_lock, fair_lock,
read_lock, write_lock, semaphore, permit_expirable_semaphore, countdown_latch)::

    aiolock.acquire.wait         histogram  s   acquire start -> outcome; + outcome:
                                                acquired | timeout | cancelled | error
    aiolock.hold.duration        histogram  s   grant -> release or loss; + outcome:
                                                released | lost
    aiolock.acquisitions         counter        acquisitions granted
    aiolock.acquire.timeouts     counter        acquisitions whose wait ran out
    aiolock.holds.lost           counter        holds lost
    aiolock.renewals             counter        watchdog renewals confirmed, per hold
    aiolock.renewal.failures     counter        watchdog renewals not confirmed, per hold
    aiolock.pubsub.reconnects    counter        pub/sub connections opened again after a
                                                loss (no attributes)

Lock names are never attributes unless asked for (``Metrics(lock_names=True)`` adds
``lock.name``): a service locking per order id would make a time series per order.

Each event is recorded in one place, by the layer where it happens, into the client's
:class:`Metrics` (handed down to the layers like the config): the acquisition loop (waits,
acquisitions, timeouts), the lease registry (hold durations, lost holds), the watchdog
(renewals). Pub/sub reconnects are counted by the transport as a plain statistic. Every
layer checks ``metrics is None`` first: without OpenTelemetry (or with ``metrics=False``)
that check is all it costs. With OpenTelemetry's API but no SDK (the global meter provider
not set), :meth:`Metrics.recording` says so and the layers time nothing: no wrapper around
an acquisition, no measurement; events start being recorded once a provider is set.

The counters are observable counters: events are counted in plain integers (per attribute
set) and read when the metrics are collected. A measurement through OpenTelemetry's SDK
costs about 15-20 us of CPU here, more than a third of an uncontended lock cycle, so the
hot path makes only the two histogram observations; to the exporter a counter is a counter
either way (a monotonic cumulative sum).

Nothing here raises into lock code: every call into OpenTelemetry is guarded, and a failing
meter provider is reported once on the logger ``aiolock.metrics`` (WARNING), then at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .extras import install_hint

try:
    from opentelemetry import metrics as otel
except ImportError:  # the otel extra is not installed
    otel = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

T = TypeVar("T")
logger = logging.getLogger("aiolock.metrics")

#: bucket boundaries (seconds) of the two histograms
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0)  # fmt: skip
HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                3600.0)  # fmt: skip
#: attribute sets kept for reuse (with lock names, one per name and type; then it starts again)
_ATTRIBUTES_KEPT = 4096

#: the counters: name -> (unit, description)
COUNTERS = {
    "aiolock.acquisitions": ("{acquisition}", "Acquisitions granted"),
    "aiolock.acquire.timeouts": ("{acquisition}", "Acquisitions whose wait ran out"),
    "aiolock.holds.lost": ("{hold}", "Holds lost"),
    "aiolock.renewals": ("{renewal}", "Watchdog renewals confirmed"),
    "aiolock.renewal.failures": (
        "{renewal}",
        "Watchdog renewals not confirmed (no reply, an error, the lock gone)",
    ),
}

INSTALL_HINT = f"aiolock's metrics need OpenTelemetry's API: {install_hint('otel')}"


class _Counted(Protocol):
    """What the pub/sub reconnects are read from: a transport's statistics."""

    def statistics(self) -> Any: ...


class Metrics:
    """Where a client records its metrics: OpenTelemetry instruments of the meter
    ``aiolock`` from ``meter_provider`` (the global one by default, set by the application
    with ``opentelemetry.metrics.set_meter_provider``; instruments made before it is set
    start recording once it is). One instance may serve many clients, on any event loop
    or thread.

    ``lock_names=True`` adds the attribute ``lock.name`` (one time series per lock name:
    only for a small, fixed set of names). Raises ImportError without opentelemetry-api.
    """

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, lock_names: bool = False
    ) -> None:
        if otel is None:
            raise ImportError(INSTALL_HINT)
        from . import __version__

        self.lock_names = lock_names
        self._attributes: dict[tuple[str, str | None, str | None], Mapping[str, str]] = {}
        self._sources: dict[int, _Source] = {}
        #: reconnects of transports no longer watched (closed or gone)
        self._retired = 0
        #: how many sources trigger a sweep of the gone ones
        self._sweep_at = 64
        self._lock = threading.Lock()
        self._failures = 0
        #: the counters' counts: counter -> (lock type, lock name or None) -> count
        self._counts: dict[str, dict[tuple[str, str | None], int]] = {c: {} for c in COUNTERS}
        #: OpenTelemetry's proxy meter while no meter provider is set (see :meth:`recording`)
        self._proxy: Any = None
        self._recording = False
        try:
            self._make_instruments(meter_provider, __version__)
        except Exception:
            # A meter provider that fails now would fail lock code later: record nothing.
            logger.warning("aiolock: metrics disabled: the meter provider failed", exc_info=True)
            self._make_instruments(otel.NoOpMeterProvider(), __version__)

    def _make_instruments(self, meter_provider: MeterProvider | None, version: str) -> None:
        assert otel is not None
        meter = otel.get_meter("aiolock", version, meter_provider=meter_provider)
        if meter_provider is None and getattr(meter, "_real_meter", False) is None:
            self._proxy = meter  # the global provider is not set yet: recording goes nowhere
        self._wait = meter.create_histogram(
            "aiolock.acquire.wait",
            unit="s",
            description="Time from the start of an acquisition to its outcome",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self._hold = meter.create_histogram(
            "aiolock.hold.duration",
            unit="s",
            description="Time from a grant to its release or loss",
            explicit_bucket_boundaries_advisory=HOLD_BUCKETS,
        )
        for counter, (unit, description) in COUNTERS.items():
            meter.create_observable_counter(
                counter, callbacks=[self._observer(counter)], unit=unit, description=description
            )
        meter.create_observable_counter(
            "aiolock.pubsub.reconnects",
            callbacks=[self._observe_reconnects],
            unit="{reconnect}",
            description="Pub/sub connections opened again after a loss",
        )

    def __repr__(self) -> str:
        names = ", lock names" if self.lock_names else ""
        return f"<aiolock.Metrics{names}>"

    # -- what the layers record ---------------------------------------------------------

    def recording(self) -> bool:
        """False while a measurement would go nowhere: on the global meter provider, until
        the application sets one (OpenTelemetry's API with no SDK configured). The layers
        check it before timing an event, so metrics cost nothing more until then; events
        from before are not counted (their histograms could not be recorded either).

        :meta private:
        """
        if self._recording:
            return True
        proxy = self._proxy
        if proxy is None or getattr(proxy, "_real_meter", True) is not None:
            self._recording = True
        return self._recording

    def attributes(self, kind: str, name: str, outcome: str | None = None) -> Mapping[str, str]:
        """The attributes of an event about the object ``name`` of type ``kind``.

        :meta private:
        """
        key = (kind, name if self.lock_names else None, outcome)
        found = self._attributes.get(key)
        if found is None:
            made = {"lock.type": kind}
            if self.lock_names:
                made["lock.name"] = name
            if outcome is not None:
                made["outcome"] = outcome
            if len(self._attributes) >= _ATTRIBUTES_KEPT:
                self._attributes.clear()
            found = self._attributes[key] = made
        return found

    async def acquisition(self, kind: str, name: str, run: Awaitable[T]) -> T:
        """Await the acquisition ``run`` (its result None: the wait ran out) and record it:
        its wait, and a grant or a timeout. Its outcome and exceptions pass unchanged.

        :meta private:
        """
        start = time.perf_counter()
        outcome = "error"
        try:
            result = await run
            outcome = "timeout" if result is None else "acquired"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            try:
                self._wait.record(time.perf_counter() - start, self.attributes(kind, name, outcome))
            except Exception:
                self._failed()
            if outcome == "acquired":
                self._count("aiolock.acquisitions", kind, name)
            elif outcome == "timeout":
                self._count("aiolock.acquire.timeouts", kind, name)

    def hold_ended(self, kind: str, name: str, seconds: float, lost: bool) -> None:
        """A hold ended after ``seconds``: released, or ``lost``.

        :meta private:
        """
        try:
            self._hold.record(seconds, self.attributes(kind, name, "lost" if lost else "released"))
        except Exception:
            self._failed()
        if lost:
            self._count("aiolock.holds.lost", kind, name)

    def renewal(self, kind: str, name: str, confirmed: bool) -> None:
        """The watchdog renewed a hold, or could not.

        :meta private:
        """
        self._count("aiolock.renewals" if confirmed else "aiolock.renewal.failures", kind, name)

    def _count(self, counter: str, kind: str, name: str) -> None:
        key = (kind, name if self.lock_names else None)
        counts = self._counts[counter]
        with self._lock:  # clients on other threads may share this instance
            counts[key] = counts.get(key, 0) + 1

    def _observer(self, counter: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        counts = self._counts[counter]

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            assert otel is not None
            with self._lock:
                snapshot = list(counts.items())
            return [
                otel.Observation(count, self.attributes(kind, name if name is not None else ""))
                for (kind, name), count in snapshot
            ]

        return observe

    def _failed(self) -> None:
        self._failures += 1
        level = logging.WARNING if self._failures == 1 else logging.DEBUG
        logger.log(
            level, "aiolock: recording a metric failed (ignored; lock code goes on)", exc_info=True
        )

    # -- pub/sub reconnects, read at collection time --------------------------------------

    def watch(self, transport: _Counted) -> None:
        """Count ``transport``'s pub/sub reconnects until :meth:`unwatch` (or until it is
        garbage collected).

        :meta private:
        """
        with self._lock:
            if id(transport) in self._sources or len(self._sources) >= self._sweep_at:
                self._sweep()  # transports gone without closing (one whose id is reused)
                self._sweep_at = max(64, 2 * len(self._sources))
            self._sources[id(transport)] = _Source(transport)

    def unwatch(self, transport: _Counted) -> None:
        """Stop watching ``transport`` (its client closed); its reconnects stay counted.

        :meta private:
        """
        with self._lock:
            source = self._sources.pop(id(transport), None)
            if source is not None:
                self._retired += source.read()

    def _sweep(self) -> None:
        """Retire the sources whose transport is gone (what they had stays counted)."""
        for key, source in list(self._sources.items()):
            if source.ref() is None:
                del self._sources[key]
                self._retired += source.seen

    def _observe_reconnects(self, options: CallbackOptions) -> Iterable[Observation]:
        assert otel is not None
        with self._lock:
            self._sweep()
            total = self._retired + sum(source.read() for source in self._sources.values())
        return [otel.Observation(total)]


class _Source:
    """A watched transport and the highest reconnect count read from it."""

    __slots__ = ("ref", "seen")

    def __init__(self, transport: _Counted) -> None:
        self.ref = weakref.ref(transport)
        self.seen = 0

    def read(self) -> int:
        transport = self.ref()
        if transport is not None:
            try:
                self.seen = max(self.seen, int(transport.statistics().pubsub_reconnects))
            except Exception:  # a transport closing on another thread: the last value stands
                pass
        return self.seen


_default: Metrics | None = None
_default_made = False
_default_lock = threading.Lock()


def default_metrics() -> Metrics | None:
    """The metrics of clients made without ``metrics=``: on OpenTelemetry's global meter
    provider when opentelemetry-api is installed, else None (no metrics)."""
    global _default, _default_made
    if _default_made:
        return _default
    with _default_lock:
        if not _default_made:
            if otel is not None:
                try:
                    _default = Metrics()
                except Exception:
                    logger.warning("aiolock: metrics disabled: making them failed", exc_info=True)
            _default_made = True
    return _default


def resolve(metrics: Metrics | bool) -> Metrics | None:
    """A client's ``metrics=`` argument: True (the default metrics), False (none), or a
    :class:`Metrics`."""
    if metrics is True:
        return default_metrics()
    if metrics is False:
        return None
    if not isinstance(metrics, Metrics):
        raise TypeError(
            f"metrics must be an aiolock.Metrics or a bool, not {type(metrics).__name__}"
        )
    return metrics


__all__ = ["INSTALL_HINT", "Metrics", "default_metrics", "resolve"]
