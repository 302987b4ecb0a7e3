"""The gateway as `main()` runs it: uvicorn on a port, the lifespan connecting to NATS."""

from __future__ import annotations

import asyncio

import httpx
import uvicorn

from crater.gateway.app import GatewaySettings, build
from crater.runtime.nats_server import NatsServer, free_port


async def test_uvicorn_serves_health_metrics_and_submissions(fresh_nats: NatsServer) -> None:
    port = free_port()
    app = build(GatewaySettings(nats_url=fresh_nats.url, http_port=port))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            body = {"task_id": "infer-1", "task_type": "inference", "model_config": {"name": "m"}}
            assert (await http.post("/api/v1/schedule", json=body)).status_code == 202
            assert (await http.get("/nowhere")).status_code == 404
            metrics = (await http.get("/metrics")).text
        assert (
            'crater_gateway_requests_total{method="POST",route="/api/v1/schedule",status="202"} 1.0'
            in metrics
        )
        assert 'route="unmatched",status="404"' in metrics
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
