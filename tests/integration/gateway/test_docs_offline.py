"""Swagger UI is served with its own assets: nothing in the page points at a CDN."""

from __future__ import annotations

import re

import httpx
import pytest

from crater.gateway.app import GatewaySettings, build

pytestmark = pytest.mark.integration


async def test_the_docs_page_and_every_asset_it_loads_come_from_the_gateway(
    nats_url: str,
) -> None:
    app = build(GatewaySettings(nats_url=nats_url))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        page = await http.get("/docs")
        assert page.status_code == 200
        assert "swagger" in page.text.lower()
        linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert linked
        assert all(link.startswith("/") for link in linked), linked  # no https://cdn...
        assert "cdn" not in page.text
        for link in linked:
            asset = await http.get(link)
            assert asset.status_code == 200, link
            assert len(asset.content) > 100
        assert "/openapi.json" in page.text
