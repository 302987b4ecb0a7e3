"""What the audit log keeps besides inputs and decisions (crater.scheduler.audit,
docs/audit.md): the core's configuration, as records a replay rebuilds it from, and the core's
whole state, as snapshots a replay starts from.

The configuration is written as JSON: every field of `SchedulerConfig` (the pipelines by
plugin name, weight and arguments, the pools and quotas as parsed from their files) except the
token secret, of which only a fingerprint is kept; a replay takes the secret from its own
settings and says so when it is not the recorded one.

A snapshot is the core (`Scheduler`) pickled without its configuration (held by the records
above: its pipelines are functions, and its secret must not be in the log), compressed. It is
loaded only through an unpickler that knows the classes a core holds and nothing else, and
only after its SHA-256 matched the digest in its chained record (`audit.load_snapshot`).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zlib
from dataclasses import asdict, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any

from crater.contracts import RestartPolicy
from crater.scheduler.domain.cluster import Overcommit
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.plugins import Pipeline
from crater.scheduler.domain.plugins.framework import Filter, Score
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota

CONFIG_FORMAT = "crater-scheduler-config/1"
SNAPSHOT_FORMAT = "crater-core-pickle5-zlib/1"


class ConfigRecordError(ValueError):
    """A configuration record this build cannot rebuild, with the field and the reason."""


class SnapshotError(ValueError):
    """A snapshot that cannot be loaded, with the reason."""


# -- configuration ----------------------------------------------------------------------------


def secret_fingerprint(secret: bytes) -> str:
    """Names a token secret without giving it away (the secret is random, at least 32 bytes
    outside development: its hash reveals nothing usable)."""
    return hashlib.sha256(b"crater-token-secret/v1:" + secret).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """A plugin argument as JSON can hold it: dataclasses as their fields."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _pipeline(pipeline: Pipeline) -> dict[str, Any]:
    return {
        "filters": [f.name for f in pipeline.filters],
        "scores": [
            {"name": s.name, "weight": s.weight, "args": {k: _plain(v) for k, v in s.args}}
            for s in pipeline.scores
        ],
    }


def _pool(policy: PoolPolicy) -> dict[str, Any]:
    return {
        "pipeline": _pipeline(policy.pipeline),
        "overcommit": asdict(policy.overcommit),
        "restart": policy.restart.model_dump(mode="json"),
        "reservation_timeout_ms": policy.reservation_timeout_ms,
        "cohort": policy.cohort,
        "lend_limit": asdict(policy.lend_limit),
        "borrow_limit": asdict(policy.borrow_limit),
        "keep_idle_gpus": policy.keep_idle_gpus,
    }


def config_json(config: SchedulerConfig) -> str:
    """`config` as a record holds it: canonical JSON (`config_dict`)."""
    return json.dumps(config_dict(config), sort_keys=True, separators=(",", ":"))


def config_dict(config: SchedulerConfig) -> dict[str, Any]:
    """Every field of `config`, the secret as its fingerprint. A field of a type this does
    not know is refused here, where a test sees it, rather than recorded wrong."""
    body: dict[str, Any] = {"format": CONFIG_FORMAT}
    for spec in fields(SchedulerConfig):
        value = getattr(config, spec.name)
        if spec.name == "token_secret":
            body["token_secret_fingerprint"] = secret_fingerprint(value)
        elif spec.name == "pipeline":
            body["pipeline"] = _pipeline(value)
        elif spec.name == "pools":
            body["pools"] = {name: _pool(policy) for name, policy in value.items()}
        elif spec.name == "quotas":
            body["quotas"] = {tenant: asdict(quota) for tenant, quota in value.items()}
        elif value is None or isinstance(value, bool | int | float | str):
            body[spec.name] = value
        else:
            raise TypeError(f"SchedulerConfig.{spec.name}: no record form for {type(value)}")
    return body


def _rebuilt_pipeline(spec: dict[str, Any], where: str) -> Pipeline:
    try:
        scores = spec["scores"]
        return Pipeline.from_names(
            list(spec["filters"]),
            {s["name"]: float(s["weight"]) for s in scores},
            {s["name"]: s["args"] for s in scores if s.get("args")},
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigRecordError(f"{where}: {error}") from error


def config_from_json(text: str, token_secret: bytes) -> SchedulerConfig:
    """The configuration a record holds, with `token_secret` (the replay's own)."""
    return config_from_dict(json.loads(text), token_secret)


def config_from_dict(body: dict[str, Any], token_secret: bytes) -> SchedulerConfig:
    """`config_dict`'s inverse, with `token_secret` (the replay's own)."""
    if not isinstance(body, dict) or body.get("format") != CONFIG_FORMAT:
        body = body if isinstance(body, dict) else {}
        raise ConfigRecordError(f"format {body.get('format')!r}: this build reads {CONFIG_FORMAT}")
    known = {spec.name for spec in fields(SchedulerConfig)}
    values: dict[str, Any] = {"token_secret": token_secret}
    for name, value in body.items():
        if name in ("format", "token_secret_fingerprint"):
            continue
        if name not in known:
            raise ConfigRecordError(f"{name}: a setting this build of the scheduler lacks")
        try:
            values[name] = _field(name, value)
        except ConfigRecordError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigRecordError(f"{name}: {error}") from error
    return SchedulerConfig(**values)


def _field(name: str, value: Any) -> Any:
    """One field of `SchedulerConfig` from its record form."""
    if name == "pipeline":
        return _rebuilt_pipeline(value, "pipeline")
    if name == "pools":
        return {
            pool: PoolPolicy(
                pipeline=_rebuilt_pipeline(spec["pipeline"], f"pools.{pool}.pipeline"),
                overcommit=Overcommit(**spec["overcommit"]),
                restart=RestartPolicy.model_validate(spec["restart"]),
                reservation_timeout_ms=spec["reservation_timeout_ms"],
                cohort=spec["cohort"],
                lend_limit=Quota(**spec["lend_limit"]),
                borrow_limit=Quota(**spec["borrow_limit"]),
                keep_idle_gpus=spec["keep_idle_gpus"],
            )
            for pool, spec in value.items()
        }
    if name == "quotas":
        return {tenant: Quota(**quota) for tenant, quota in value.items()}
    return value


# -- snapshots --------------------------------------------------------------------------------


@cache
def code_fingerprint() -> str:
    """The build of the core that writes or reads a snapshot: SHA-256 over the sources of the
    scheduling core (`crater.scheduler.domain`) and of this module. A snapshot is a pickle of
    that code's objects: another build may hold other fields, so it is refused by name."""
    digest = hashlib.sha256()
    roots = [Path(__file__).parent / "domain"]
    files = sorted(p for root in roots for p in root.rglob("*.py"))
    for path in [*files, Path(__file__)]:
        digest.update(path.relative_to(Path(__file__).parent).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _config_parts(config: SchedulerConfig) -> list[tuple[tuple[str, ...], Any]]:
    """Every object of the configuration a core's state may point to, each with a name: the
    configuration itself, its pipelines and their scores (filters are the registry's)."""
    parts: list[tuple[tuple[str, ...], Any]] = [(("config",), config)]
    pipelines = {"": config.pipeline} | {f"pool:{k}": p.pipeline for k, p in config.pools.items()}
    for where, pipeline in pipelines.items():
        parts.append((("pipeline", where), pipeline))
        parts += [(("score", where, str(i)), s) for i, s in enumerate(pipeline.scores)]
    return parts


_CONFIG_TYPES = frozenset({Filter, SchedulerConfig, Pipeline, Score})


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, config: SchedulerConfig) -> None:
        super().__init__(file, protocol=5)
        self.names: dict[int, tuple[str, ...]] = {}
        for name, part in _config_parts(config):
            self.names.setdefault(id(part), name)

    def persistent_id(self, obj: Any) -> Any:
        # The configuration stays out (records hold it); filters by their registry name.
        # Called for every object pickled: an exact type look-up, not isinstance chains.
        kind = type(obj)
        if kind not in _CONFIG_TYPES:
            return None
        if kind is Filter:
            return ("filter", obj.name)
        found = self.names.get(id(obj))
        if found is None:
            raise SnapshotError(f"the core holds a {kind.__name__} not its own")
        return found


# What a core's state holds, beyond the crater classes: a snapshot naming anything else is not
# one the scheduler wrote, and is refused before it can run code.
_ALLOWED = {
    ("collections", "Counter"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("datetime", "datetime"),
    ("datetime", "date"),
    ("datetime", "timedelta"),
    ("datetime", "timezone"),
    ("uuid", "UUID"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.dtypes", "BoolDType"),
    ("numpy.dtypes", "Int64DType"),
    ("numpy.dtypes", "Float64DType"),
    ("numpy.dtypes", "StrDType"),
    ("pydantic_core._pydantic_core", "TzInfo"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "bytearray"),
    ("builtins", "slice"),
    ("builtins", "range"),
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, config: SchedulerConfig) -> None:
        super().__init__(file)
        self.parts = dict(_config_parts(config))

    def persistent_load(self, pid: Any) -> Any:
        from crater.scheduler.domain.plugins import FILTERS

        name = tuple(pid) if isinstance(pid, tuple | list) else ()
        if len(name) == 2 and name[0] == "filter" and name[1] in FILTERS:
            return FILTERS[name[1]]
        if name not in self.parts:
            raise SnapshotError(
                f"the snapshot points to {pid!r} of a configuration that the one in force "
                "here lacks (changed without a configuration record?)"
            )
        return self.parts[name]

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("crater.") or (module, name) in _ALLOWED:
            found = super().find_class(module, name)
            if module.startswith("crater.") and not isinstance(found, type):
                raise SnapshotError(f"the snapshot calls {module}.{name}: not a class of a core")
            return found
        raise SnapshotError(f"the snapshot names {module}.{name}, which no core holds")


def dump_core(core: Scheduler) -> bytes:
    """The core's whole state, its configuration left out, compressed (fast: it is taken in
    the decision's transaction)."""
    buffer = io.BytesIO()
    _Pickler(buffer, core.config).dump(core)
    return zlib.compress(buffer.getvalue(), 1)


def load_core(data: bytes, config: SchedulerConfig) -> Scheduler:
    """A core from `dump_core`'s bytes, running `config` (the one in force when it was
    taken). Check the bytes' digest first (`audit.load_snapshot`)."""
    try:
        raw = zlib.decompress(data)
        core = _Unpickler(io.BytesIO(raw), config).load()
    except SnapshotError:
        raise
    except Exception as error:  # a damaged or foreign pickle: said, never half-loaded
        raise SnapshotError(f"the snapshot does not load: {error}") from error
    if not isinstance(core, Scheduler):
        raise SnapshotError(f"the snapshot holds a {type(core).__name__}, not a core")
    return core


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
