"""API keys: bearer tokens `crt_<43 url-safe characters>` (32 random bytes), kept only as their
SHA-256 (a 256-bit random secret needs no slow hash: nothing to guess), per tenant, with
scopes. Stored in a JetStream key-value bucket shared by every gateway replica (keyed by the
hash; `crater tokens` writes there) or in a keys file (YAML or JSON, read-only to the gateway,
reread when it changes). Shared by the gateway and `crater tokens`."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import nats.js.errors
import yaml
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import AwareDatetime, BaseModel, Field, TypeAdapter

from crater.contracts.tasks import Name

API_KEYS_BUCKET = "crater_gateway_api_keys"
TOKEN_PREFIX = "crt_"
KEY_ID_LENGTH = 12  # hex characters of the hash that name a key (list, revoke, logs)


class Scope(StrEnum):
    SUBMIT = "submit"  # POST /api/v1/schedule (dry_run too), usage samples
    READ = "read"  # GET tasks and nodes, placement dry runs, resolve
    CANCEL = "cancel"  # cancel a task
    ADMIN = "admin"  # every scope, every tenant's tasks


class ApiKey(BaseModel):
    """What is kept of a key: never the token."""

    hash: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the token, hex.")
    tenant: Name
    user: Name | None = Field(
        default=None,
        description="The user the key submits as (a task's `user`): set, a submission naming "
        "no user gets it and one naming another is refused (403). None: the request's own.",
    )
    scopes: list[Scope] = Field(min_length=1)
    name: str = Field(default="", max_length=200)
    created: AwareDatetime
    revoked: AwareDatetime | None = None

    @property
    def key_id(self) -> str:
        return self.hash[:KEY_ID_LENGTH]


KEYS_FILE = TypeAdapter(list[ApiKey])


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_key(
    tenant: str, scopes: list[Scope], name: str = "", user: str | None = None
) -> tuple[str, ApiKey]:
    """A fresh token (shown once) and what is stored of it."""
    token = new_token()
    key = ApiKey(
        hash=token_hash(token),
        tenant=tenant,
        user=user,
        scopes=sorted(set(scopes)),
        name=name,
        created=datetime.now(UTC),
    )
    return token, key


def read_keys_file(path: Path) -> list[ApiKey]:
    """The keys in a YAML or JSON file (a list of records; `{keys: [...]}` too); none if absent."""
    if not path.exists():
        return []
    loaded: Any = yaml.safe_load(path.read_text()) or []
    if isinstance(loaded, dict):
        loaded = loaded.get("keys", [])
    return KEYS_FILE.validate_python(loaded)


def write_keys_file(path: Path, keys: list[ApiKey]) -> None:
    """Replace the file at once (write, then rename), readable by its owner only."""
    temporary = path.with_name(path.name + ".tmp")
    data = KEYS_FILE.dump_python(keys, mode="json")
    text = json.dumps(data, indent=2) if path.suffix == ".json" else yaml.safe_dump(data)
    temporary.write_text(text)
    temporary.chmod(0o600)
    os.replace(temporary, path)


class KeysFile:
    """A keys file, reread when its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._keys: dict[str, ApiKey] = {}

    def lookup(self, hashed: str) -> ApiKey | None:
        stat = self.path.stat()
        if (stat.st_mtime_ns, stat.st_size) != self._seen:
            self._keys = {k.hash: k for k in read_keys_file(self.path)}
            self._seen = (stat.st_mtime_ns, stat.st_size)
        return self._keys.get(hashed)


async def kv_lookup(bucket: KeyValue, hashed: str) -> ApiKey | None:
    try:
        entry = await bucket.get(hashed)
    except nats.js.errors.KeyNotFoundError:
        return None
    if not entry.value:
        return None
    return ApiKey.model_validate_json(entry.value)


async def kv_keys(bucket: KeyValue) -> list[ApiKey]:
    try:
        hashes = await bucket.keys()
    except nats.js.errors.NoKeysError:
        return []
    found = [await kv_lookup(bucket, h) for h in hashes]
    return sorted((k for k in found if k is not None), key=lambda k: k.created)


def find_key(keys: list[ApiKey], key_id: str) -> ApiKey:
    """The one key whose id (or hash) starts with `key_id`."""
    matches = [k for k in keys if len(key_id) >= 8 and k.hash.startswith(key_id.lower())]
    if len(matches) != 1:
        raise LookupError(
            f"{len(matches)} keys match {key_id!r}: give at least 8 characters of the key id"
        )
    return matches[0]


async def kv_bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    """The API keys' bucket, created (on `replicas` servers) if no gateway has yet."""
    try:
        return await js.key_value(API_KEYS_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_key_value(bucket=API_KEYS_BUCKET, history=1, replicas=replicas)


async def kv_put(bucket: KeyValue, key: ApiKey) -> None:
    await bucket.put(key.hash, key.model_dump_json().encode())
