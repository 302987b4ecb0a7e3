"""Tracing and metrics set-up: one TracerProvider and one Prometheus registry per process."""

from __future__ import annotations

from typing import IO

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from prometheus_client import CollectorRegistry

from crater.contracts import TraceContext


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def make_tracer_provider(service: str, trace_file: str | None) -> TracerProvider:
    """A provider named after the service; with `trace_file`, finished spans go there as JSONL."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"crater-{service}"}))
    if trace_file:
        out: IO[str] = open(trace_file, "a", buffering=1)  # noqa: SIM115 - lives with the process
        provider.add_span_processor(
            SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_one_line))
        )
    trace.set_tracer_provider(provider)
    return provider


def current_trace_context() -> TraceContext | None:
    """The active span's W3C context, to stamp on an event for audit."""
    carrier: dict[str, str] = {}
    inject(carrier)
    if "traceparent" not in carrier:
        return None
    return TraceContext(traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate"))


def make_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)
