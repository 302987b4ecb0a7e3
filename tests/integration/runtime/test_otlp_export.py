"""Spans leave over OTLP/HTTP when OpenTelemetry's standard variables say so: a local
endpoint receives them and decodes them with opentelemetry-proto."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from crater.runtime.telemetry import make_tracer_provider, otlp_wanted

pytestmark = pytest.mark.integration


class Collector(ThreadingHTTPServer):
    """A stand-in OTLP/HTTP collector: keeps each decoded export request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, ExportTraceServiceRequest]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                decoded = ExportTraceServiceRequest()
                decoded.ParseFromString(body)
                collector.requests.append(
                    (self.path, self.headers.get("content-type", ""), decoded)
                )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.shutdown()


def test_spans_reach_an_otlp_http_endpoint(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    provider = make_tracer_provider("scheduler", None)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("decide") as parent:
        with tracer.start_as_current_span("commit"):
            pass
        trace_id = parent.get_span_context().trace_id
    assert provider.force_flush(5_000)
    [(path, content_type, request)] = collector.requests  # one batch, not a POST per span
    assert path == "/v1/traces"
    assert content_type == "application/x-protobuf"
    [resource_spans] = request.resource_spans
    attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert attributes["service.name"] == "crater-scheduler"
    spans = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert sorted(s.name for s in spans) == ["commit", "decide"]
    assert {int.from_bytes(s.trace_id, "big") for s in spans} == {trace_id}
    provider.shutdown()


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),
    ],
)
def test_otlp_is_on_only_when_the_standard_variables_ask(env: dict[str, str], wanted: bool) -> None:
    assert otlp_wanted(env) is wanted
