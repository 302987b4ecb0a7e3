"""The console's templates and vendored assets are files of the gateway's package: they must
be in its wheel, or an installed gateway serves pages without them."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from crater.gateway.console import STATIC

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv to build the wheel")
def test_the_gateway_wheel_carries_the_console_templates_and_assets(tmp_path: Path) -> None:
    subprocess.run(
        ["uv", "build", "--package", "crater-gateway", "--wheel", "-o", str(tmp_path), "-q"],
        cwd=ROOT,
        check=True,
        timeout=240,
    )
    [wheel] = tmp_path.glob("crater_gateway-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    folder = "crater/gateway/console"
    for asset in ("htmx.min.js", "htmx-ext-sse.min.js", "console.css", "console.js"):
        assert f"{folder}/static/{asset}" in names
        assert (STATIC / asset).stat().st_size > 500
    for template in ("base.html", "login.html", "pools.html", "_tasks.html", "_node.html"):
        assert f"{folder}/templates/{template}" in names
    assert f"{folder}/static/LICENSE.htmx" in names
