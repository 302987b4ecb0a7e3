from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crater.contracts import FieldError, Priority, TaskRequest
from crater.gateway.bodies import (
    BodyTooLarge,
    parse_task_request,
    read_limited,
    request_errors,
    submission_id,
)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_bodies_up_to_the_limit_are_read_whole() -> None:
    assert await read_limited(chunks(b"ab", b"cd"), limit=4) == b"abcd"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    async def never() -> AsyncIterator[bytes]:
        raise AssertionError("read although the declared length was too large")
        yield b""

    with pytest.raises(BodyTooLarge, match="1024-byte limit"):
        await read_limited(never(), limit=1024, declared_length="1025")


async def test_an_undeclared_body_is_refused_once_it_passes_the_limit() -> None:
    with pytest.raises(BodyTooLarge):
        await read_limited(chunks(b"x" * 3, b"x" * 3), limit=5, declared_length=None)


def test_valid_requests_parse_with_the_model_config_alias() -> None:
    parsed = parse_task_request(
        b'{"task_id": "t", "task_type": "inference", "model_config": {"name": "gpt2"}}'
    )
    assert isinstance(parsed, TaskRequest)
    assert parsed.model_spec.name == "gpt2"


def test_errors_name_dotted_fields_and_the_body_for_bad_json() -> None:
    assert parse_task_request(b"{") == [
        FieldError(
            field="body", reason="Invalid JSON: EOF while parsing an object at line 1 column 1"
        )
    ]
    errors = parse_task_request(
        b'{"task_id": "t", "task_type": "training", "model_config": {"name": "m"},'
        b' "resource_requirements": {"gpu": {"count": -2, "memory_mb": "lots"}}}'
    )
    assert isinstance(errors, list)
    assert [e.field for e in errors] == [
        "resource_requirements.gpu.count",
        "resource_requirements.gpu.memory_mb",
    ]


def test_query_errors_drop_where_the_value_came_from() -> None:
    errors = request_errors(
        [
            {"loc": ("query", "limit"), "msg": "Input should be greater than or equal to 1"},
            {"loc": ("path", "task_id"), "msg": "bad"},
            {"loc": (), "msg": "whole request"},
        ]
    )
    assert [(e.field, e.reason) for e in errors] == [
        ("limit", "Input should be greater than or equal to 1"),
        ("task_id", "bad"),
        ("request", "whole request"),
    ]


def test_submission_ids_repeat_for_the_same_key_and_body_only() -> None:
    request = TaskRequest.model_validate(
        {"task_id": "t", "task_type": "inference", "model_config": {"name": "m"}}
    )
    changed = request.model_copy(update={"priority": Priority.HIGH})
    assert submission_id(request, "k") == submission_id(request, "k")
    assert submission_id(request, "k") != submission_id(request, "other")
    assert submission_id(request, "k") != submission_id(changed, "k")


def test_a_body_nested_deeper_than_the_limit_is_refused_before_decoding() -> None:
    deep = b'{"task_id": "t", "extra": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert parse_task_request(deep) == [
        FieldError(
            field="body",
            reason="JSON nested 1001 levels deep; at most 64 are accepted (max_json_depth)",
        )
    ]
    errors = parse_task_request(b"[[[[]]]]", max_depth=3)
    assert isinstance(errors, list)
    assert "at most 3" in errors[0].reason
