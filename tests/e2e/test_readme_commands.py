"""Every command README.md shows, run as a person following it runs it, against one live
`crater up` (issue #23: the demo's banner and the README's examples are exactly true).

The commands are read from README.md's shell code blocks (```sh, ```bash, ```console), not
copied here: a command the README gains and nobody checked fails this test (CHECKS names what
each one must show, SKIPPED why one cannot run here, and both must name commands the README
really has). The README's notation is expanded: `probe [--full]` is two commands, `webhooks
list | retry ID | replay --since 15m` three, and `ID` is a real id of this run.

The demo runs as `make up` runs it (`crater up`, its defaults, from a directory of its own,
so `var/demo/` is that directory's). Each command runs in `bash -c`, in that directory, after
`source var/demo/env.sh` as the README says, with `uv run` finding this checkout
(UV_PROJECT, and UV_FROZEN so the lock is never touched). Every command must exit 0 (or the
code the README gives it), print no traceback and no `None`, and show what the README says it
shows. The banner `crater up` prints is checked the same way: every URL answers, every
command it suggests runs as printed, the token is where it says, Ctrl-C stops everything.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.parallel import HEAVY_STACK

pytestmark = [pytest.mark.e2e, HEAVY_STACK]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL_FENCES = {"sh", "bash", "console", "shell"}
COMMAND_STARTS = ("uv run crater ", "crater ", "curl ", "make ")
SESSION_STARTS = ("source ", ". ", "export ")  # lines that set up the shell the others run in
DEMO_NODES = {"a100-01", "a100-pcie-01", "h100-01", "rtx4090-01", "v100-01", "t4-01", "cpu-01"}

# What the README shows that cannot run here, and why. A key is the start of a command.
SKIPPED = {
    "make up": "is what this test runs, as `crater up` (make up runs `uv run --frozen crater "
    "up`, which runs until Ctrl-C)",
    "make test": "the whole test suite, this test among it",
    "make lint": "ruff and mypy over the tree: CI's lint job, nothing a live stack shows",
    "make docs": "rewrites docs/ from the contracts; tests/unit/test_generated_docs.py checks they "
    "are current",
    "uv run crater chaos ": "the 860 s chaos run against PostgreSQL; its short run is "
    "tests/e2e/test_chaos_short.py",
    "uv run crater simulate --policy fgd --seeds 42-51": "ten seeds of the openb trace, minutes "
    "of CPU; tests/unit/cli/test_simulate_cli.py runs the command small",
}
# Commands that need nothing running: they run in a thread of their own from the start, beside
# the demo's start and the other commands (still as the README shows them, from the demo's
# directory), so the test takes the longer of the two, not both.
OFFLINE = (
    "uv run crater predict ",
    "uv run crater probe",
    "uv run crater topology-export ",
    "uv run crater autoscale-sim ",
)
# Exit codes the README gives a command (by its start), other than 0, and where it says so.
EXPECTED_EXIT: dict[str, tuple[tuple[int, ...], str]] = {
    "uv run crater schedule-test ": ((0, 1), "`schedule-test` exits 1 when no node fits"),
}
NONE_WORD = re.compile(r"\bNone\b")
# What a command that succeeded must not print on stderr: a logger's warnings, asyncio's
# complaints (progress and notes on stderr are fine).
NOISE = re.compile(r"\b(WARNING|ERROR|Exception)\b|eof_received|Task was destroyed")


@dataclass(frozen=True)
class Shown:
    """A command as README.md shows it: its text, what the README says after `#`, its line."""

    text: str
    comment: str
    line: int


@dataclass
class Ran:
    command: str
    code: int
    out: str
    err: str = ""
    seconds: float = 0.0

    @property
    def both(self) -> str:
        return self.out + self.err

    def rows(self, table: str = "") -> list[dict[str, str]]:
        """The tab-separated rows of a piped table (the one under `# TABLE` when given): its
        header line, then its rows up to the next title or a line that is not a row."""
        lines = self.out.splitlines()
        if table:
            lines = lines[lines.index(f"# {table}") + 1 :]
        lines = [x for x in lines if x]
        while lines and lines[0].startswith("# "):
            lines = lines[1:]
        if not lines:
            return []
        header = lines[0].split("\t")
        rows = []
        for line in lines[1:]:
            if line.startswith("# ") or "\t" not in line:
                break  # the next table, or a summary line
            rows.append(dict(zip(header, line.split("\t"), strict=False)))
        return rows


# ---- reading the README ---------------------------------------------------------------------


def shell_lines(markdown: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line inside a shell code block, continuations joined."""
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(markdown.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip().lower() if fence is None else None
            continue
        if fence not in SHELL_FENCES:
            continue
        if fence == "console":
            stripped = stripped.removeprefix("$ ")
        if pending is not None:
            stripped = pending[1] + " " + stripped
            number = pending[0]
            pending = None
        if stripped.endswith("\\"):
            pending = (number, stripped[:-1].rstrip())
            continue
        if stripped:
            yield number, stripped


def split_comment(line: str) -> tuple[str, str]:
    """The command and its trailing `# comment` (a `#` after a space, outside quotes)."""
    quote: str | None = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line, ""


def expand(command: str) -> list[str]:
    """The README's notation as the commands it stands for: `[--opt]` optional, and, on a
    crater line, `sub a | b ARG | c` alternatives of the command group (a `|` before a program,
    `| jq`, is a pipe)."""
    if match := re.search(r" \[(--[\w-]+)\]", command):
        without = command[: match.start()] + command[match.end() :]
        with_it = command[: match.start()] + " " + match.group(1) + command[match.end() :]
        return [*expand(without), *expand(with_it)]
    words = command.split()
    if "crater" in words[:3] and " | " in command:
        parts = command.split(" | ")
        if all(shutil.which(p.split()[0]) is None for p in parts[1:]):
            group = words[: words.index("crater") + 2]  # e.g. uv run crater webhooks
            return [parts[0], *(" ".join([*group, p.strip()]) for p in parts[1:])]
    return [command]


def readme_commands() -> tuple[list[Shown], list[Shown]]:
    """(the shell set-up lines, the commands), in the README's order."""
    session: list[Shown] = []
    commands: list[Shown] = []
    for number, line in shell_lines(README.read_text()):
        text, comment = split_comment(line)
        if text.startswith(SESSION_STARTS):
            session.append(Shown(text, comment, number))
        elif text.startswith(COMMAND_STARTS):
            commands.extend(Shown(one, comment, number) for one in expand(text))
    return session, commands


def skip_reason(command: str) -> str | None:
    return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)


# ---- running ----------------------------------------------------------------------------------


@dataclass
class Demo:
    """`crater up` in the background, its output as it comes."""

    process: subprocess.Popen[str]
    workdir: Path
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def banner(self, timeout: float = 150.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.lines[:]
            if any(x.startswith("Ctrl-C stops everything.") for x in text):
                start = next(i for i, x in enumerate(text) if x.startswith("up in "))
                end = next(i for i, x in enumerate(text) if x.startswith("Ctrl-C stops"))
                return [x.rstrip("\n") for x in text[start : end + 1]]
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail("crater up printed no banner:\n" + "".join(self.lines[-60:]))

    def wait_for(self, pattern: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.output(), re.M):
                return True
            time.sleep(0.5)
        return False


def start_demo(workdir: Path, env: dict[str, str]) -> Demo:
    process = subprocess.Popen(
        # `make up` is `uv run --frozen crater up`: this interpreter is that environment's
        [sys.executable, "-m", "crater.cli", "up", "--duration", "600"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    demo = Demo(process, workdir)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            demo.lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return demo


def shell(
    command: str, env: dict[str, str], cwd: Path, answer: str | None = None, timeout: float = 180
) -> Ran:
    """`command` as bash runs it; with `answer`, on a terminal, typing it when asked."""
    started = time.monotonic()
    if answer is None:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Ran(command, done.returncode, done.stdout, done.stderr, time.monotonic() - started)
    parent, child = pty.openpty()
    process = subprocess.Popen(
        ["bash", "-c", command], cwd=cwd, env=env, stdin=child, stdout=child, stderr=child
    )
    os.close(child)
    os.write(parent, answer.encode())
    chunks = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([parent], [], [], left)[0]:
            break  # still waiting for something: killed below
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    if process.poll() is None and time.monotonic() >= deadline:
        process.kill()
    code = process.wait(timeout)
    out = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    out = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the terminal's colours
    return Ran(command, code, out, "", time.monotonic() - started)


def as_user(command: str) -> str:
    """The command as a person types it; `| jq` dropped where jq is not installed (the JSON is
    parsed here instead)."""
    if shutil.which("jq") is None:
        command = re.sub(r"\s*\|\s*jq\s*$", "", command)
    return command


def json_of(ran: Ran) -> Any:
    return json.loads(ran.out)


# ---- what each command must show ---------------------------------------------------------------


@dataclass
class Context:
    """What the checks compare with: the live stack, asked directly."""

    gateway: str
    token: str
    workdir: Path
    ids: dict[str, str] = field(default_factory=dict)  # placeholder -> a real id

    @property
    def nodes(self) -> list[str]:
        """Every node the scheduler knows, now."""
        return [n["node_id"] for n in self.get("/api/v1/nodes")["nodes"]]

    def get(self, path: str) -> Any:
        response = httpx.get(
            f"{self.gateway}{path}", headers={"authorization": f"Bearer {self.token}"}, timeout=10
        )
        response.raise_for_status()
        return response.json()


Check = Callable[[Ran, Context], None]


def table_has(*columns: str) -> Check:
    def check(ran: Ran, ctx: Context) -> None:
        header = ran.out.splitlines()[0 if not ran.out.startswith("# ") else 1].split("\t")
        assert set(columns) <= set(header), header

    return check


def list_nodes(ran: Ran, ctx: Context) -> None:
    """every node, what is free on it"""
    rows = ran.rows()
    assert {"GPUs free", "CPU free", "memory free GiB"} <= set(rows[0]), rows[0]
    listed = {r["node"] for r in rows}
    assert listed == set(ctx.nodes), listed ^ set(ctx.nodes)  # every node the scheduler knows
    assert DEMO_NODES | {"local-01"} <= listed, listed
    assert 30 <= len(listed) <= 45  # "about three dozen" and this machine
    for row in rows:
        free, total = row["GPUs free"].split("/")
        assert 0 <= int(free) <= int(total), row


def tasks(ran: Ran, ctx: Context) -> None:
    """tasks, where they run or why they wait"""
    rows = ran.rows()
    assert rows, ran.out
    for row in rows:
        if row["status"] in ("running", "scheduled"):
            assert row["node"] != "-", row
            assert row["why"], row
        if row["status"] == "pending":
            assert row["node"] == "-", row
            assert row["why"], row


def cost(ran: Ran, ctx: Context) -> None:
    """GPU-hours (idle among them) and cost this month"""
    title = ran.out.splitlines()[0]
    assert re.match(r"# usage \d{4}-\d\d-01 00:00 \.\. ", title), title  # this month
    rows = ran.rows()
    assert {"GPU-hours", "idle GPU-h", "cost USD"} <= set(rows[0]), rows[0]
    total = next(r for r in rows if r["tenant"] == "total")
    assert float(total["GPU-hours"]) > 0, total
    assert float(total["cost USD"]) > 0, total


def submitted(ran: Ran, ctx: Context) -> None:
    assert re.match(r"submitted llama2-7b-sft-0042 \(event [0-9a-f-]{36}\)", ran.out), ran.out
    deadline = time.monotonic() + 60  # accepted; the scheduler hears of it through the bus
    while time.monotonic() < deadline:
        if "llama2-7b-sft-0042" in {t["task_id"] for t in ctx.get("/api/v1/tasks")["tasks"]}:
            return
        time.sleep(0.5)
    raise AssertionError("llama2-7b-sft-0042 never reached the scheduler")


def tasks_json(ran: Ran, ctx: Context) -> None:
    listed = json_of(ran)["tasks"]
    assert "llama2-7b-sft-0042" in {t["task_id"] for t in listed}  # submitted just before
    assert all(t["status"] for t in listed)


def fits(*prefixes: str, mig: bool = False) -> Check:
    """Every node that fits, best first, and every one that does not with its reason; when
    the demo's tasks hold every node that could, none fits and it says why (exit 1)."""

    def check(ran: Ran, ctx: Context) -> None:
        fitting, misfits = ran.rows("fits"), ran.rows("does not fit")
        nodes = ctx.nodes
        assert {r["node"] for r in fitting} | {r["node"] for r in misfits} == set(nodes)
        assert all(r["reason"] for r in misfits), misfits
        assert re.search(rf"^{len(fitting)}/{len(nodes)} nodes fit; ", ran.out, re.M), ran.out
        assert bool(fitting) == (ran.code == 0), ran.out
        assert all(r["node"].startswith(prefixes) for r in fitting), fitting
        if mig:
            assert all(r["GPUs"].endswith("(1g.10gb)") for r in fitting), fitting

    return check


def predicted(ran: Ran, ctx: Context) -> None:
    assert re.search(r"^peak\t[\d,]+\t", ran.out, re.M), ran.out
    assert "timeline drawn to timeline.png" in ran.both
    assert (ctx.workdir / "timeline.png").read_bytes().startswith(b"\x89PNG")


def probed(ran: Ran, ctx: Context) -> None:
    """this machine's topology"""
    for start in ("CPU ", "NUMA 0: ", "memory ", "GPU"):
        assert re.search(rf"^{start}", ran.out, re.M), (start, ran.out)


def probed_full(ran: Ran, ctx: Context) -> None:
    """--full measures memory bandwidth and disk IOPS too"""
    probed(ran, ctx)
    assert re.search(r"GB/s copy, one thread \(measured\)", ran.out), ran.out
    assert re.search(r"random 4 KiB reads/s", ran.out), ran.out


def diagnosed(ran: Ran, ctx: Context) -> None:
    """every health check of a node, with the reason"""
    rows = ran.rows()
    assert len(rows) >= 5, rows
    assert all(r["detail"] for r in rows), rows
    assert re.search(
        r"^a100-01: (Ready|Degraded), health score \d+/100 \(as its probe reported", ran.out, re.M
    )


def topology(ran: Ran, ctx: Context) -> None:
    assert ran.out.startswith(("digraph", "graph")), ran.out[:200]
    png = (ctx.workdir / "a100.png").read_bytes()
    assert png.startswith(b"\x89PNG"), png[:8]
    width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: width, then height
    assert 600 <= width <= 2400, width  # readable, not thousands of pixels wide
    assert re.search(r"wrote a100\.png \(\d+x\d+ px\)", ran.err), ran.err


def webhooks_listed(ran: Ran, ctx: Context) -> None:
    rows = ran.rows()
    assert any(r["state"] == "delivered" and r["last"] == "200" for r in rows), rows[:5]


def retried(ran: Ran, ctx: Context) -> None:
    assert ran.out.strip() == f"delivery {ctx.ids['webhook']} is due now", ran.out


def replayed_webhooks(ran: Ran, ctx: Context) -> None:
    assert re.search(r"send these \d+ deliveries again \(same webhook-id\)\?", ran.out), ran.out
    assert re.search(r"\b\d+ deliveries since \S+ are due now", ran.out), ran.out


def letters_listed(ran: Ran, ctx: Context) -> None:
    """messages a consumer gave up on"""
    rows = ran.rows()
    mine = [r for r in rows if r["id"] == ctx.ids["letter"]]
    assert mine, rows
    assert mine[0]["service"] == "predictor", mine
    assert mine[0]["why"].startswith("body: not valid JSON"), mine


def letter_shown(ran: Ran, ctx: Context) -> None:
    assert f"dead letter {ctx.ids['letter']} " in ran.out
    assert "refused by predictor" in ran.out, ran.out
    assert POISONS[0].decode() in ran.out, ran.out


def letter_replayed(ran: Ran, ctx: Context) -> None:
    assert re.search(
        rf"^dead letter {ctx.ids['letter']} replayed \S+ \S+ to crater\.v1\.task\.submitted",
        ran.out,
        re.M,
    ), ran.out


def all_replayed(ran: Ran, ctx: Context) -> None:
    """every letter never replayed: the second poison message at least"""
    assert re.search(rf"^dead letter {ctx.ids['other letter']} replayed ", ran.out, re.M), ran.out
    assert not re.search(rf"^dead letter {ctx.ids['letter']} replayed ", ran.out, re.M), ran.out


def trace_written(ran: Ran, ctx: Context) -> None:
    assert re.match(r"wrote [\d,]+ requests over 4 h \(seed 1\) to trace\.csv", ran.out), ran.out
    assert (ctx.workdir / "trace.csv").stat().st_size > 0


def simulated(ran: Ran, ctx: Context) -> None:
    rows = ran.rows()
    assert list(rows[0])[1:] == ["crater", "hpa 0.45", "hpa 0.7"], rows[0]
    assert any(r[""].startswith("SLO attainment") for r in rows), rows
    assert "wrote autoscale.png" in ran.both
    assert (ctx.workdir / "autoscale.png").read_bytes().startswith(b"\x89PNG")


def dry_run(ran: Ran, ctx: Context) -> None:
    answer = json_of(ran)
    assert answer["dry_run"] is True
    assert answer["prediction"]["gpu_memory_per_gpu_mb"] > 0
    placement = answer["placement"]
    assert placement["outcome"] in ("placed", "waiting", "rejected"), placement
    if placement["outcome"] == "placed":
        assert placement["members"], placement
    # nothing held: the task id is not taken
    known = {t["task_id"] for t in ctx.get("/api/v1/tasks?limit=500")["tasks"]}
    assert answer["task_id"] not in known


def resolved(ran: Ran, ctx: Context) -> None:
    """task (POST it to /api/v1/schedule as is), prediction and a one-line explanation"""
    answer = json_of(ran)
    assert answer["task"]["resource_requirements"]["gpu"]["count"] in (1, 2, 4, 8)
    assert answer["prediction"]["gpu_memory_per_gpu_mb"] > 0
    assert answer["explanation"]
    assert "\n" not in answer["explanation"]
    response = httpx.post(
        f"{ctx.gateway}/api/v1/schedule",
        json=answer["task"],
        headers={"authorization": f"Bearer {ctx.token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


DRY_RUN = (
    "curl -s -XPOST 'localhost:8080/api/v1/schedule?dry_run=true' -H 'content-type: "
    'application/json\' -H "Authorization: Bearer $CRATER_API_TOKEN" -d '
    "@tests/fixtures/alldata/alldata_task.json"
)
RESOLVE = (
    "curl -s -XPOST localhost:8080/api/v1/resolve -H 'content-type: application/json' -H "
    '"Authorization: Bearer $CRATER_API_TOKEN" -d \'{"framework": "pytorch", "model_size": '
    '"8B", "data_volume": "2TB"}\''
)
CHECKS: dict[str, Check] = {
    "uv run crater list-nodes": list_nodes,
    "uv run crater tasks": tasks,
    "uv run crater cost --by tenant": cost,
    "uv run crater submit examples/train-llama2-7b.json": submitted,
    'curl -s -H "Authorization: Bearer $CRATER_API_TOKEN" "$CRATER_GATEWAY_URL/api/v1/tasks" '
    "| jq": tasks_json,
    'uv run crater schedule-test --resource-request \'{"gpu": 2, "gpu_memory": "40Gi"}\' '
    "--pool training": fits("a100-0", "h100-0"),
    "uv run crater schedule-test --resource-request '{\"gpu\": 1}' --node-selector "
    "crater.ai/gpu-model=a100": fits("a100-"),
    'uv run crater schedule-test --resource-request \'{"gpu": {"count": 1, "mig_profile": '
    '"1g.10gb"}}\' --toleration dedicated=llm --pool training': fits("a100-0", "h100-0", mig=True),
    "uv run crater predict examples/train-llama2-7b.json --explain --plot timeline.png": predicted,
    "uv run crater probe": probed,
    "uv run crater probe --full": probed_full,
    "uv run crater diagnose --node a100-01": diagnosed,
    "uv run crater topology-export --node a100-01 --png a100.png": topology,
    "uv run crater webhooks list": webhooks_listed,
    "uv run crater webhooks retry ID": retried,
    "uv run crater webhooks replay --since 15m": replayed_webhooks,
    "uv run crater dead-letters list": letters_listed,
    "uv run crater dead-letters show ID": letter_shown,
    "uv run crater dead-letters replay ID": letter_replayed,
    "uv run crater dead-letters replay --all": all_replayed,
    "uv run crater autoscale-sim --generate trace.csv --hours 4 --seed 1": trace_written,
    "uv run crater autoscale-sim --trace trace.csv --hpa-target 0.45 --hpa-target 0.7 --plot "
    "autoscale.png": simulated,
    DRY_RUN: dry_run,
    RESOLVE: resolved,
}
# Commands that ask before they act: run on a terminal, answered so.
ANSWERS = {"uv run crater webhooks replay --since 15m": "y\n"}
# `ID` in a command: which id of this run stands for it.
PLACEHOLDERS = {
    "uv run crater webhooks retry ID": "webhook",
    "uv run crater dead-letters show ID": "letter",
    "uv run crater dead-letters replay ID": "letter",
}
POISONS = (b'{"task_id": "readme-poison", not json', b'{"task_id": "readme-poison-2", no')


def test_the_readme_names_no_command_nobody_checks() -> None:
    """Offline, in a second: every README command is checked or skipped with its reason, and
    those lists name only commands the README has."""
    session, commands = readme_commands()
    texts = [c.text for c in commands]
    unchecked = [c for c in commands if c.text not in CHECKS and skip_reason(c.text) is None]
    assert not unchecked, f"README commands nobody checks (add them to CHECKS): {unchecked}"
    assert not set(CHECKS) - set(texts), (
        f"checks of commands not in the README: {set(CHECKS) - set(texts)}"
    )
    stale = [s for s in SKIPPED if not any(t.startswith(s) for t in texts)]
    assert not stale, f"skipped commands the README no longer shows: {stale}"
    for table in (ANSWERS, PLACEHOLDERS):
        assert set(table) <= set(texts), set(table) - set(texts)
    readme = " ".join(README.read_text().split())
    for start, (_, said) in EXPECTED_EXIT.items():
        assert any(t.startswith(start) for t in texts), start
        assert said in readme, f"the README does not say {said!r}: exit 0 is expected"
    assert [s.text for s in session] == ["source var/demo/env.sh"], session


def test_skipped_crater_commands_name_only_options_that_exist() -> None:
    """What cannot run here is at least spelt right: each option it uses is in its --help."""
    _, commands = readme_commands()
    for command in (c.text for c in commands if skip_reason(c.text) and "crater" in c.text):
        words = shlex.split(command)
        sub = words[words.index("crater") + 1]
        shown = subprocess.run(
            [sys.executable, "-m", "crater.cli", sub, "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "300"},
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        for option in (w.split("=")[0] for w in words if w.startswith("--")):
            assert option in shown.stdout, f"{command}: {option} is not an option of {sub}"


def clean_environment() -> dict[str, str]:
    """A person's shell: none of this session's CRATER_* settings; `uv run` finds this
    checkout from anywhere and never touches its lock."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRATER_")}
    return {**env, "UV_PROJECT": str(ROOT), "UV_FROZEN": "1"}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the person runs everything: the checkout's files the README names, and
    var/demo/ of its own (crater up empties its data dir)."""
    for name in ("examples", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


# The whole demo and every command: 150 s alone on a slow day, past the suite's 300 s beside
# the failover tests in a parallel run (a CI run timed out while stopping the demo); each
# step keeps its own limit (banner, commands, Ctrl-C).
@pytest.mark.timeout(900)
def test_every_readme_command_runs_against_the_demo_as_shown(workdir: Path) -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv is not on the PATH: the README's commands run through it")
    session, commands = readme_commands()
    base = clean_environment()
    demo = start_demo(workdir, base)
    problems: list[str] = []
    ran: list[Ran] = []

    def run(shown: str, env: dict[str, str], ctx: Context | None) -> None:
        command = shown
        for placeholder, key in PLACEHOLDERS.items():
            if shown == placeholder:
                command = shown.replace(" ID", f" {ctx.ids[key] if ctx else 'ID'}")
        command = as_user(command)
        if ctx is not None and "localhost:8080" in command:
            # The README's `localhost:8080` is the gateway's port when it was free.
            command = command.replace("localhost:8080", ctx.gateway.removeprefix("http://"))
        result = shell(command, env, workdir, answer=ANSWERS.get(shown))
        ran.append(result)
        expected = next((c for s, (c, _) in EXPECTED_EXIT.items() if shown.startswith(s)), (0,))
        said = f"`{command}` (exit {result.code}, {result.seconds:.1f} s):\n{result.both[-3000:]}"
        if result.code not in expected:
            problems.append(f"exit {result.code}, not {expected}: {said}")
        if "Traceback" in result.both:
            problems.append(f"a traceback: {said}")
        if NONE_WORD.search(result.both):
            problems.append(f"'None' in its output: {said}")
        if result.code == 0 and NOISE.search(result.err):
            problems.append(f"log noise on stderr: {said}")
        check = CHECKS.get(shown)
        if check is not None and result.code in expected and ctx is not None:
            try:
                check(result, ctx)
            except Exception as error:
                problems.append(f"not what the README says ({error!r}): {said}")

    # The commands that need nothing running run beside the others, from the start: the
    # test takes the time of the longer of the two, not of both.
    offline = [c.text for c in commands if c.text.startswith(OFFLINE)]
    offline_ctx = Context("http://unused", "", workdir)

    def run_offline() -> None:
        for command in offline:
            run(command, base, offline_ctx)

    beside = threading.Thread(target=run_offline, daemon=True)
    beside.start()
    try:
        banner = demo.banner()
        env = session_env(base, workdir, session)
        ctx = Context(env["CRATER_GATEWAY_URL"], env["CRATER_API_TOKEN"], workdir)
        # the demo's first line: the whole fleet has reported
        assert demo.wait_for(r"▣ the scheduler knows \d+ nodes", 60), demo.output()[-3000:]
        problems += check_banner(banner, demo, ctx, base)
        ctx.ids["letter"], ctx.ids["other letter"] = map(str, dead_letters(env))
        ctx.ids["webhook"] = first_delivery(env, workdir)
        for shown in commands:
            if shown.text in offline or skip_reason(shown.text):
                continue
            run(shown.text, env, ctx)
        beside.join(600)
        problems += check_what_the_demo_showed(demo, workdir)
    finally:
        stopped = stop(demo)
        beside.join(600)
    problems += stopped
    timings = "\n".join(f"{r.seconds:6.1f} s  exit {r.code}  {r.command[:120]}" for r in ran)
    print(f"{len(ran)} README commands run:\n{timings}")  # shown with -s or -rA
    assert not problems, f"{len(problems)} false:\n\n" + "\n\n".join(problems) + f"\n\n{timings}"


def session_env(base: dict[str, str], workdir: Path, session: list[Shown]) -> dict[str, str]:
    """The shell after the README's set-up lines (`source var/demo/env.sh`)."""
    lines = "; ".join(s.text for s in session)
    done = subprocess.run(
        ["bash", "-c", f"{lines} && env -0"], cwd=workdir, env=base, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    env = dict(x.split("=", 1) for x in done.stdout.decode().split("\0") if "=" in x)
    token = (workdir / "var/demo/secrets/admin-token").read_text().strip()
    assert env["CRATER_API_TOKEN"] == token
    return env


def check_banner(banner: list[str], demo: Demo, ctx: Context, base: dict[str, str]) -> list[str]:
    """Every URL the banner prints answers, every command it suggests runs as printed, the key
    is where it says."""
    problems = []
    head = re.match(r"up in [\d.]+ s\. nats: (\S+)  gateway: (\S+)  console: (\S+)$", banner[0])
    assert head, banner[0]
    nats_url, gateway, console = head.groups()
    if gateway != ctx.gateway:
        problems.append(f"banner's gateway {gateway}, env.sh's {ctx.gateway}")
    with httpx.Client(timeout=10, follow_redirects=True) as client:
        for line in banner[1:]:
            if found := re.match(r"  (\S+)\s+(http://\S+)/healthz  (/\S+)\s+log: (\S+)$", line):
                name, url, more, log = found.groups()
                for path in ("/healthz", more):
                    answer = client.get(url + path)
                    if not answer.is_success:
                        problems.append(
                            f"banner: {url}{path} ({name}) answers {answer.status_code}"
                        )
                if not (demo.workdir / log).is_file():
                    problems.append(f"banner: {name}'s log {log} is not there")
        # the console: its sign-in page, then signed in with the key the banner names
        page = client.get(console)
        if page.status_code != 200 or "api_key" not in page.text:
            problems.append(f"banner: {console} answers {page.status_code} without a sign-in")
        signed = client.post(
            f"{console}/login", data={"api_key": ctx.token, "next": "/console/pools"}
        )
        if signed.status_code != 200 or "/console/login" in str(signed.url):
            problems.append(f"the console refuses the admin key: {signed.status_code}")
        unauthorised = client.get(f"{gateway}/api/v1/tasks")
        if unauthorised.status_code != 401:
            problems.append(f"the gateway answered {unauthorised.status_code} without a token")
    nats = re.match(r"tls://(127\.0\.0\.1):(\d+)$", nats_url)
    if nats is None:
        problems.append(f"banner: nats {nats_url}")
    notes = " ".join(banner)
    key = re.search(r"the admin key in (\S+),", notes)
    if key is None or not (demo.workdir / key.group(1)).is_file():
        problems.append(f"banner: no admin key where it says: {notes}")
    elif (demo.workdir / key.group(1)).read_text().strip() != ctx.token:
        problems.append("banner: the key it names is not the one env.sh exports")
    suggested = next((x for x in banner if x.startswith("try, in another shell:")), None)
    if suggested is None:
        return [*problems, "banner: no command suggested"]
    command = suggested.removeprefix("try, in another shell:").strip()
    result = shell(command, base, demo.workdir)  # a fresh shell: only what the line does
    if result.code != 0 or "Traceback" in result.both:
        problems.append(f"banner's `{command}` exits {result.code}: {result.both[-2000:]}")
    elif "GPUs free" not in result.out or "why" not in result.out:
        problems.append(f"banner's `{command}` did not list nodes and tasks: {result.out[:500]}")
    return problems


def dead_letters(env: dict[str, str]) -> tuple[int, int]:
    """Two messages the predictor cannot decode, published as the README's user could (NATS
    as the admin env.sh names): dead-lettered at once. Their ids: the first for `dead-letters
    show ID` and `replay ID`, the second for `replay --all` to find never replayed."""
    import asyncio

    from crater.runtime.nats_connection import NatsConnection

    password = Path(env["CRATER_NATS_PASSWORD_FILE"]).read_text().strip()

    async def publish() -> None:
        as_admin = NatsConnection(
            env["CRATER_NATS_URL"], env["CRATER_NATS_USER"], password, env["CRATER_NATS_TLS_CA"]
        )
        connection = await as_admin.connect()
        try:
            for poison in POISONS:
                await connection.jetstream().publish("crater.v1.task.submitted", poison)
        finally:
            await connection.close()

    asyncio.run(publish())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = subprocess.run(
            [sys.executable, "-m", "crater.cli", "dead-letters", "list", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        letters = [json.loads(x) for x in listed.stdout.splitlines() if x.strip()]
        mine = sorted(x["id"] for x in letters if x["subject"] == "crater.v1.task.submitted")
        if listed.returncode == 0 and len(mine) >= 2:
            return mine[0], mine[1]
        time.sleep(1)
    pytest.fail(f"no dead letters: {listed.stdout} {listed.stderr}")


def first_delivery(env: dict[str, str], workdir: Path) -> str:
    """The newest webhook delivery's id, for `webhooks retry ID`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = subprocess.run(
            [sys.executable, "-m", "crater.cli", "webhooks", "list", "--json"],
            env=env,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        if listed.stdout.strip():
            return str(json.loads(listed.stdout.splitlines()[0])["id"])
        time.sleep(1)
    pytest.fail("no webhook delivered")


# The README's sample of the demo's lines, by their mark: each mark the demo always prints in
# its first minute must match a line it printed; the others, when it printed one.
ALWAYS = {"→", "≈", "✔", "↪", "≋"}


def sample_lines() -> list[str]:
    text = README.read_text()
    start = text.index("Each\ndecision is printed as it happens")
    block = text[text.index("```\n", start) + 4 :]
    return [x for x in block[: block.index("```")].splitlines() if x.strip()]


def shape(line: str) -> re.Pattern[str]:
    """A sample line as a pattern: its words as written, any number where it has a number,
    anything where it says `...`."""
    body = re.sub(r"^\s*[\d.]+s ", "", line)
    parts = re.split(r"(\d+(?:\.\d+)?|\.\.\.)", body)
    pattern = "".join(
        r"\d+(?:\.\d+)?"
        if re.fullmatch(r"\d+(?:\.\d+)?", p)
        else ".*"
        if p == "..."
        else re.escape(p)
        for p in parts
    )
    return re.compile(r"^\s*[\d.]+s " + pattern + "$", re.M)


def check_what_the_demo_showed(demo: Demo, workdir: Path) -> list[str]:
    problems = []
    output = demo.output()
    for line in sample_lines():
        mark = re.sub(r"^\s*[\d.]+s ", "", line)[0]
        printed = [
            x for x in output.splitlines() if re.match(rf"^\s*[\d.]+s {re.escape(mark)} ", x)
        ]
        if (mark in ALWAYS or printed) and not shape(line).search(output):
            problems.append(
                f"the README's sample line is not what the demo prints:\n{line}\n"
                f"the demo's lines of that kind:\n" + "\n".join(printed[:5])
            )
    if "client-0001 placed on local-01" not in output:
        problems.append("this machine (local-01) ran no task")
    demo_dir = workdir / "var/demo"
    for name in ("traces.jsonl", "webhooks.jsonl"):
        if not (demo_dir / name).is_file() or not (demo_dir / name).stat().st_size:
            problems.append(f"var/demo/{name} is empty or missing")
    if "None" in output or "Traceback" in output:
        bad = [x for x in output.splitlines() if NONE_WORD.search(x) or "Traceback" in x]
        problems.append("the demo printed:\n" + "\n".join(bad[:10]))
    return problems


def stop(demo: Demo) -> list[str]:
    """Ctrl-C, as the banner says: everything stops, cleanly."""
    if demo.process.poll() is not None:
        return [f"crater up ended early ({demo.process.returncode}):\n{demo.output()[-3000:]}"]
    demo.process.send_signal(signal.SIGINT)
    try:
        code = demo.process.wait(90)
    except subprocess.TimeoutExpired:
        demo.process.kill()
        demo.process.wait()
        return ["Ctrl-C did not stop crater up within 90 s"]
    time.sleep(0.5)  # the reader's last lines
    tail = demo.output()[demo.output().find("stopping:") :]
    problems = []
    if code != 0 or not tail.rstrip().endswith("stopped."):
        problems.append(f"Ctrl-C: crater up exited {code}:\n{tail[-3000:]}")
    if "Traceback" in demo.output():
        problems.append("Ctrl-C: a traceback:\n" + tail[-3000:])
    return problems
