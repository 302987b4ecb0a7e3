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
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel

from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.plugins import Pipeline
from crater.scheduler.domain.plugins.framework import Filter, Score

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


def _encode(value: Any, where: str) -> Any:
    """A configuration value as JSON holds it, by its type, so that a field added to the
    configuration (or to a pool's policy) is recorded without this module knowing it: a
    pipeline by its plugins, a pydantic model as its JSON, a dataclass field by field."""
    if isinstance(value, Pipeline):
        return _pipeline(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _encode(getattr(value, f.name), f"{where}.{f.name}")
            for f in fields(value)
            if f.init
        }
    if isinstance(value, dict):
        return {str(k): _encode(v, f"{where}.{k}") for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"{where}: no record form for {type(value).__name__}")


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
        else:
            body[spec.name] = _encode(value, spec.name)
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


def _decode(hint: Any, value: Any, where: str) -> Any:
    """`_encode`'s inverse, by the field's type."""
    if hint is Pipeline:
        return _rebuilt_pipeline(value, where)
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        if value is None:
            return None
        kinds = [k for k in get_args(hint) if k is not type(None)]
        return _decode(kinds[0], value, where) if len(kinds) == 1 else value
    if origin is dict:
        _, kind = get_args(hint)
        return {k: _decode(kind, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint.model_validate(value)
    if isinstance(hint, type) and is_dataclass(hint):
        hints = get_type_hints(hint)
        unknown = sorted(set(value) - set(hints))
        if unknown:
            raise ConfigRecordError(f"{where}.{unknown[0]}: a setting this build lacks")
        return hint(**{k: _decode(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    return value


def _field(name: str, value: Any) -> Any:
    """One field of `SchedulerConfig` from its record form."""
    return _decode(get_type_hints(SchedulerConfig)[name], value, name)


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
