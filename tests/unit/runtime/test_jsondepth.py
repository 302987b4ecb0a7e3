"""The JSON depth scan: the nesting json.loads would recurse through, found without it."""

from __future__ import annotations

import json

import pytest

from crater.runtime.jsondepth import NotText, TooDeep, check_json_depth, check_json_text, json_depth


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b'"[[[["', 0),  # brackets inside a string do not count
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b"[[1], [2], [3]]", 2),  # siblings do not add up
        (b'{"a": "x\\"[[[", "b": [[]]}', 3),  # nor do they after an escaped quote
        (b'{"a": "\\\\", "b": [[]]}', 3),  # an escaped backslash ends before the quote
        ('{"ключ": ["значение"]}', 2),  # text as well as bytes
        (b"[" * 1000 + b"]" * 1000, 1000),
    ],
)
def test_depth_is_the_deepest_nesting_of_arrays_and_objects(body: bytes | str, depth: int) -> None:
    assert json_depth(body) == depth


def test_depth_agrees_with_a_decode_on_a_realistic_document() -> None:
    def decoded_depth(value: object) -> int:
        if isinstance(value, dict):
            return 1 + max(map(decoded_depth, value.values()), default=0)
        if isinstance(value, list):
            return 1 + max(map(decoded_depth, value), default=0)
        return 0

    document = {
        "node": {"gpus": [{"links": [{"peer": 1, "kind": "NVLINK"}]}] * 8, "name": "a{[b"},
        "labels": {"crater.ai/gpu-model": "A100"},
    }
    assert json_depth(json.dumps(document)) == decoded_depth(document) == 6


def test_too_deep_names_the_depth_and_the_limit() -> None:
    check_json_depth(b"[" * 64 + b"]" * 64, limit=64)  # at the limit: accepted
    with pytest.raises(TooDeep, match="nested 65 levels deep; at most 64") as refused:
        check_json_depth(b"[" * 65 + b"]" * 65, limit=64)
    assert (refused.value.depth, refused.value.limit) == (65, 64)
    assert isinstance(refused.value, ValueError)  # a decode failure, as json's own are


def test_unclosed_text_is_bounded_by_its_brackets() -> None:
    assert json_depth(b"[[[") == 3
    # an unterminated string is no string: its brackets count (decoding refuses it anyway)
    assert json_depth(b'["unterminated [[[') == 4


# -- strings that are not Unicode text (the fuzzer's lone surrogates and NULs) ---------------


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        (rb'{"model_config": {"name": "\udb39\uddcdP"}}', None, None),  # a pair: text
        (rb'{"model_config": {"name": "\udb39P"}}', "model_config.name", "U+DB39"),
        (rb'{"model_config": {"name": "\uddcd"}}', "model_config.name", "U+DDCD"),
        (rb'{"command": ["ok", "a\u0000b"]}', "command.1", "NUL"),
        (rb'{"\ud800": 1}', "\ud800", "key"),
        (rb'"\ud800"', "body", "U+D800"),
        (rb'{"name": "\\ud800"}', None, None),  # an escaped backslash, then text
        (rb'{"name": "plain"}', None, None),
        (rb"not json \ud800", None, None),  # for the decoder to refuse
    ],
)
def test_a_lone_surrogate_or_nul_is_named_by_its_field(
    body: bytes, field: str | None, said: str | None
) -> None:
    if field is None:
        check_json_text(body)
        return
    with pytest.raises(NotText) as raised:
        check_json_text(body)
    assert raised.value.field == field
    assert said is not None
    assert said in raised.value.what


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": [1, {"b": "[[[[[[[["}]}',  # many brackets, most inside a string: depth 3
        b'{"a": [{"b": 1}, {"c": 2}, {"d": 3}, {"e": 4}]}',  # many, none deep: depth 3
        "[[[]]]",
    ],
)
def test_the_check_agrees_with_the_scan_either_side_of_the_limit(body: bytes | str) -> None:
    """Past its shortcut (no more opening brackets than the limit, so no deeper) too."""
    depth = json_depth(body)
    check_json_depth(body, depth)  # at the limit: passes, whichever way it is found
    with pytest.raises(TooDeep):
        check_json_depth(body, depth - 1)
