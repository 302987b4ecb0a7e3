"""`crater schedule-test` options for the newer filters: node selector and tolerations."""

from __future__ import annotations

from typer.testing import CliRunner

from crater.cli.dry_run import _toleration
from crater.cli.main import app
from crater.contracts import Taint, Toleration


def test_toleration_options_read_as_kubernetes_tolerations() -> None:
    llm = Taint.parse("dedicated=llm:NoSchedule")
    assert Toleration.model_validate(_toleration("dedicated=llm")).tolerates(llm)
    assert Toleration.model_validate(_toleration("dedicated")).tolerates(llm)  # any value
    assert not Toleration.model_validate(_toleration("dedicated=batch")).tolerates(llm)
    assert not Toleration.model_validate(_toleration("dedicated:NoExecute")).tolerates(llm)
    assert Toleration.model_validate(_toleration("*")).tolerates(llm)


def test_a_bad_selector_or_toleration_is_refused_before_asking_anyone() -> None:
    runner = CliRunner()
    nowhere = "http://127.0.0.1:9"  # nothing listens: a request would fail differently
    bad_selector = runner.invoke(
        app,
        [
            "schedule-test",
            "--resource-request",
            "{}",
            "--node-selector",
            "rack",
            "--gateway",
            nowhere,
        ],
    )
    assert bad_selector.exit_code == 2
    assert "--node-selector 'rack': expected KEY=VALUE" in bad_selector.output
    bad_effect = runner.invoke(
        app,
        [
            "schedule-test",
            "--resource-request",
            "{}",
            "--toleration",
            "a=b:Soon",
            "--gateway",
            nowhere,
        ],
    )
    assert bad_effect.exit_code == 2
    assert "effect" in bad_effect.output


def test_the_flat_resource_request_operators_type_is_read() -> None:
    runner = CliRunner()
    nowhere = "http://127.0.0.1:9"  # nothing listens: parsed requests end at the connection
    flat = runner.invoke(
        app,
        [
            "schedule-test",
            "--resource-request",
            '{"gpu": 2, "gpu_memory": "40Gi"}',
            "--gateway",
            nowhere,
        ],
    )
    assert flat.exit_code == 3  # unreachable
    assert "no gateway at" in flat.output
    assert "invalid resource request" not in flat.output
    unknown = runner.invoke(
        app,
        ["schedule-test", "--resource-request", '{"gpus": 2}', "--gateway", nowhere],
    )
    assert unknown.exit_code == 2
    assert "invalid resource request" in unknown.output
    assert "unknown key 'gpus'" in unknown.output
