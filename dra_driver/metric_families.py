"""Prometheus metric families declared as data, registered by one piece of code for both daemons.

A daemon's metrics class lists its families in its class body, one declaration each (name, help,
labels, buckets)::

    class ControllerMetrics(MetricSet):
        placements = CounterFamily("gpuready_controller_placements", "Claims placed ...", ("policy", "result"))

and :class:`MetricSet` registers every declared family in the instance's own registry at construction
(never prometheus_client's global default registry: the demo runs several daemons in one process).
Read on an instance, a declaration is that instance's live ``Gauge``/``Counter``/``Histogram``
(``self.placements.labels(...).inc()``, typed as such); read on the class it is the declaration, so
code can walk the families (``families_of``) instead of repeating their names and labels.

Families filled at scrape time by a custom collector use the same declaration: :meth:`Family.fresh`
gives an empty family of that name, help and labels to add the samples to.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Self, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

# The ``*_created`` companion series double the exposition size and no dashboard reads them. Process
# wide in prometheus_client; set here, where every family of both daemons is registered.
disable_created_metrics()

M = TypeVar("M", bound=MetricWrapperBase)


class Family(Generic[M]):
    """One metric family: ``name`` (as exported, without the ``_total`` prometheus_client adds to a
    counter), ``help``, ``labels`` and, for a histogram, ``buckets``."""

    instrument: ClassVar[type[MetricWrapperBase]]

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] | None = None) -> None:
        self.name = name
        self.help = help
        self.labels = labels
        self.buckets = buckets
        self.attribute = ""  # the class attribute it is declared as (set by Python, __set_name__)

    def __set_name__(self, owner: type, name: str) -> None:
        self.attribute = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: MetricSet, owner: type | None = None) -> M: ...

    def __get__(self, obj: MetricSet | None, owner: type | None = None) -> Self | M:
        if obj is None:
            return self
        return cast(M, obj.live_families[self.attribute])

    def register(self, registry: CollectorRegistry) -> M:
        """The live family, registered in ``registry``."""
        extra: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        return cast(M, self.instrument(self.name, self.help, list(self.labels), registry=registry, **extra))

    def fresh(self) -> Metric:
        """An empty family to fill at scrape time (a custom collector's ``collect``)."""
        raise TypeError(f"{type(self).__name__} {self.name} cannot be filled at scrape time")


class GaugeFamily(Family[Gauge]):
    """A gauge."""

    instrument = Gauge

    def fresh(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))


class CounterFamily(Family[Counter]):
    """A counter (exported as ``<name>_total``)."""

    instrument = Counter

    def fresh(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.help, labels=list(self.labels))


class HistogramFamily(Family[Histogram]):
    """A histogram; ``buckets`` are its upper bounds (prometheus_client adds ``+Inf``)."""

    instrument = Histogram


def families_of(cls: type) -> list[Family[Any]]:
    """The families declared in the body of ``cls`` and its bases, in declaration order (bases first)."""
    found: dict[str, Family[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, Family):
                found[name] = value
    return list(found.values())


class MetricSet:
    """Registers every family declared in the subclass's body in ``registry`` (a fresh private
    ``CollectorRegistry`` when None, never the global default), in declaration order."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.live_families: dict[str, MetricWrapperBase] = {
            family.attribute: family.register(self.registry) for family in families_of(type(self))}
