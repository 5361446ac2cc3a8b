"""Metric families declared once as data: what a scraper reads is exactly the declaration."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dra_driver.metric_families import CounterFamily, GaugeFamily, HistogramFamily, MetricSet, families_of


class Sample(MetricSet):
    up = GaugeFamily("sample_up", "1 while up.")
    requests = CounterFamily("sample_requests", "Requests, by code.", ("code",))
    latency = HistogramFamily("sample_latency_seconds", "Latency.", ("route",), (0.1, 1.0))


class MoreSample(Sample):
    errors = CounterFamily("sample_errors", "Errors.")


def scrape(metrics: MetricSet) -> str:
    return generate_latest(metrics.registry).decode()


def test_each_declaration_is_exported_with_its_name_help_labels_and_buckets() -> None:
    m = Sample()
    m.up.set(1)
    m.requests.labels("200").inc(3)
    m.latency.labels("/x").observe(0.5)
    text = scrape(m)
    assert "# HELP sample_up 1 while up.\n# TYPE sample_up gauge\nsample_up 1.0\n" in text
    assert '# HELP sample_requests_total Requests, by code.\n' in text
    assert 'sample_requests_total{code="200"} 3.0\n' in text
    assert [line for line in text.splitlines() if line.startswith("sample_latency_seconds_bucket")] == [
        'sample_latency_seconds_bucket{le="0.1",route="/x"} 0.0',
        'sample_latency_seconds_bucket{le="1.0",route="/x"} 1.0',
        'sample_latency_seconds_bucket{le="+Inf",route="/x"} 1.0',
    ]
    assert "_created" not in text  # companion series off for both daemons


def test_each_instance_owns_its_series() -> None:
    shared = CollectorRegistry()
    first, second = Sample(), Sample()
    first.requests.labels("500").inc()
    assert 'code="500"' in scrape(first) and 'code="500"' not in scrape(second)
    Sample(shared)
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # the same registry twice is a bug
        Sample(shared)


def test_the_class_lists_its_declarations_in_order_bases_first() -> None:
    assert [f.name for f in families_of(MoreSample)] == [
        "sample_up", "sample_requests", "sample_latency_seconds", "sample_errors"]
    assert Sample.requests.labels == ("code",)
    assert "sample_errors_total" in scrape(MoreSample())


def test_a_declaration_gives_an_empty_family_to_fill_at_scrape_time() -> None:
    family = Sample.requests.fresh()
    family.add_metric(["404"], 2)
    assert (family.name, family.type, family.documentation) == ("sample_requests", "counter", "Requests, by code.")
    assert [(s.name, s.labels, s.value) for s in family.samples] == [("sample_requests_total", {"code": "404"}, 2)]
    assert Sample.up.fresh().type == "gauge"
    with pytest.raises(TypeError, match="sample_latency_seconds cannot be filled at scrape time"):
        Sample.latency.fresh()
