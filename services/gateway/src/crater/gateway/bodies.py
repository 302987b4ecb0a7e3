"""Reading and judging request bodies: pure functions of bytes, no framework."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterable, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID, uuid5

from pydantic import BaseModel, TypeAdapter, ValidationError

from crater.contracts import FieldError, TaskRequest
from crater.runtime.bus import field_errors
from crater.runtime.jsondepth import NotText, TooDeep, check_json_depth, check_json_text

Parsed = TypeVar("Parsed", bound=BaseModel)
_IDEMPOTENCY_NAMESPACE = UUID("3f0c6a4e-2b8d-4c1e-9a57-0d6c2f5b8e21")
# FastAPI's error locations start with where the value came from; ours name the field only.
_LOCATION_ROOTS = frozenset({"body", "query", "path", "header", "cookie"})
_ARRAY: TypeAdapter[list[Any]] = TypeAdapter(list[Any])


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the {limit}-byte limit (max_body_bytes)")
        self.limit = limit


async def read_limited(
    chunks: AsyncIterable[bytes], limit: int, declared_length: str | None = None
) -> bytes:
    """The whole body, refused as soon as it is known to exceed `limit` bytes, so an
    oversized upload is never held in memory."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        raise BodyTooLarge(limit)
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(limit)
    return bytes(body)


def parse_task_request(body: bytes, max_depth: int = 64) -> TaskRequest | list[FieldError]:
    """A valid request, or every field that is wrong and why (paths as bus rejections name
    them: dotted, e.g. `resource_requirements.gpu.count`; `body` for the body as a whole).
    A body nested deeper than `max_depth` is refused before it is decoded."""
    return parse_body(body, TaskRequest, max_depth)


def is_array(body: bytes) -> bool:
    """Whether `body` is a JSON array (the batch form of a submission)."""
    return body.lstrip()[:1] == b"["


class ArrayUnreadable(ValueError):
    """An array submission that cannot be read as a whole (each reason names `body`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.errors = [FieldError(field="body", reason=reason)]


def parse_task_batch(
    body: bytes, max_depth: int = 64, max_tasks: int = 500
) -> list[TaskRequest | list[FieldError]]:
    """A JSON array of task requests: per element, the request or every field of it that is
    wrong (named within the element, as for a single body). Raises ArrayUnreadable when the
    array itself cannot be read (not JSON, not text, too deep, empty or too long)."""
    try:
        check_json_depth(body, max_depth + 1)
        check_json_text(body)
        items = _ARRAY.validate_json(body)
    except (TooDeep, NotText) as error:
        raise ArrayUnreadable(str(error)) from None
    except ValidationError as error:
        raise ArrayUnreadable(f"not a JSON array: {error.errors()[0]['msg']}") from None
    if not items:
        raise ArrayUnreadable("an empty array: no task to submit")
    if len(items) > max_tasks:
        raise ArrayUnreadable(
            f"{len(items)} tasks in one array; at most {max_tasks} (max_batch_tasks)"
        )
    parsed: list[TaskRequest | list[FieldError]] = []
    for item in items:
        try:  # each element as its own body: JSON mode, the same coercions and error paths
            parsed.append(TaskRequest.model_validate_json(json.dumps(item)))
        except ValidationError as error:
            parsed.append(field_errors(error))
    return parsed


def parse_body(body: bytes, model: type[Parsed], max_depth: int = 64) -> Parsed | list[FieldError]:
    """`body` as a `model`, or every field that is wrong and why (as `parse_task_request`)."""
    try:
        check_json_depth(body, max_depth)
        check_json_text(body)
    except TooDeep as error:
        return [FieldError(field="body", reason=str(error))]
    except NotText as error:
        return [FieldError(field=error.field, reason=error.what)]
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        return field_errors(error)


def request_errors(errors: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """FastAPI's query/path validation errors in the same (field, reason) form."""
    found = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ())]
        if loc[:1] and loc[0] in _LOCATION_ROOTS:
            loc = loc[1:]
        found.append(FieldError(field=".".join(loc) or "request", reason=str(error.get("msg"))))
    return found


def submission_id(request: TaskRequest, idempotency_key: str) -> UUID:
    """The event id for a submission under an `Idempotency-Key`: a retried identical POST gets
    the same id, so JetStream's duplicate window drops the second copy; a changed body under
    the same key is a new submission."""
    digest = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
    return uuid5(_IDEMPOTENCY_NAMESPACE, f"{idempotency_key}\n{digest}")
