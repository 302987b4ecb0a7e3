"""Tracing and metrics set-up: one TracerProvider and one Prometheus registry per process."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import IO

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanContext
from prometheus_client import CollectorRegistry

from crater.contracts import TraceContext

log = logging.getLogger("crater.telemetry")


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


# The demo's JSON-lines file is read by people and tests watching a run: flushed each second.
FILE_FLUSH_MILLIS = 1000


def make_tracer_provider(
    service: str, trace_file: str | None, environ: Mapping[str, str] | None = None
) -> TracerProvider:
    """A provider named after the service. Finished spans are exported in batches, off the
    request path: to `trace_file` as JSON lines (the demo's), and over OTLP/HTTP when the
    standard variables ask for it (`otlp_wanted`); the exporter reads the rest of them
    (OTEL_EXPORTER_OTLP_*: endpoint, headers, timeout, compression; OTEL_BSP_*: batching)."""
    env = os.environ if environ is None else environ
    provider = TracerProvider(resource=Resource.create({"service.name": f"crater-{service}"}))
    if trace_file:
        out: IO[str] = open(trace_file, "a", buffering=1)  # noqa: SIM115 - lives with the process
        provider.add_span_processor(
            BatchSpanProcessor(
                ConsoleSpanExporter(out=out, formatter=_one_line),
                schedule_delay_millis=FILE_FLUSH_MILLIS,
            )
        )
    if otlp_wanted(env):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def otlp_wanted(env: Mapping[str, str]) -> bool:
    """OTLP export as OpenTelemetry's variables say: OTEL_TRACES_EXPORTER naming `otlp`, or
    an OTLP endpoint set without OTEL_TRACES_EXPORTER=none. Only OTLP over HTTP/protobuf is
    shipped; asking for gRPC logs a warning and exports over HTTP."""
    exporters = {e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if "none" in exporters:
        return False
    wanted = "otlp" in exporters or bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if wanted and protocol != "http/protobuf":
        log.warning("OTLP protocol %r is not shipped: exporting over http/protobuf", protocol)
    return wanted


def current_trace_context() -> TraceContext | None:
    """The active span's W3C context, to stamp on an event for audit."""
    carrier: dict[str, str] = {}
    inject(carrier)
    if "traceparent" not in carrier:
        return None
    return TraceContext(traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate"))


def incoming_span_context(
    headers: Mapping[str, str] | None, fallback: TraceContext | None = None
) -> SpanContext | None:
    """The span a message came from: its W3C `traceparent` header (what every publish sends),
    else `fallback` (the context its body names); None when neither is a valid one."""
    for carrier in (headers, fallback.model_dump(exclude_none=True) if fallback else None):
        if carrier and "traceparent" in carrier:
            found = trace.get_current_span(extract(carrier)).get_span_context()
            if found.is_valid:
                return found
    return None


def trace_context_of(span: SpanContext) -> TraceContext:
    """A span's W3C context as an event carries it."""
    state = span.trace_state.to_header() if span.trace_state else None
    return TraceContext(
        traceparent=f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}",
        tracestate=state or None,
    )


def make_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)
