from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from crater.callback.domain.breaker import BreakerState, CircuitBreaker
from crater.callback.domain.signing import (
    SignatureError,
    Verifier,
    decode_secret,
    generate_secret,
    sign,
)

# The example of the Standard Webhooks specification (and of its reference libraries).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_specification_example() -> None:
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_signature_is_hmac_sha256_of_id_timestamp_body() -> None:
    secret = generate_secret()
    key = decode_secret(secret)
    digest = hmac.new(key, b"wh-1.1700000000.{}", hashlib.sha256).digest()
    assert sign(secret, "wh-1", 1_700_000_000, b"{}") == "v1," + base64.b64encode(digest).decode()


def test_verifier_accepts_a_fresh_signature_and_any_of_several() -> None:
    verifier = Verifier(SPEC_SECRET)
    header = f"v1,bm90LXRoaXMtb25l {SPEC_SIGNATURE}"  # rotation: an old one, then the right one
    verifier.verify(SPEC_ID, str(SPEC_TIMESTAMP), header, SPEC_BODY, now=SPEC_TIMESTAMP + 299)


@pytest.mark.parametrize(
    ("webhook_id", "body", "signature"),
    [
        ("msg_other", SPEC_BODY, SPEC_SIGNATURE),  # another id
        (SPEC_ID, b'{"test": 1}', SPEC_SIGNATURE),  # another body
        (SPEC_ID, SPEC_BODY, "v2," + SPEC_SIGNATURE[3:]),  # unknown version
        (SPEC_ID, SPEC_BODY, "v1,AAAA"),
    ],
)
def test_verifier_refuses_a_wrong_signature(webhook_id: str, body: bytes, signature: str) -> None:
    with pytest.raises(SignatureError) as error:
        Verifier(SPEC_SECRET).verify(
            webhook_id, str(SPEC_TIMESTAMP), signature, body, SPEC_TIMESTAMP
        )
    assert not error.value.replay


@pytest.mark.parametrize("offset", [-301, 301, -86400])
def test_verifier_refuses_a_stale_or_future_timestamp(offset: int) -> None:
    with pytest.raises(SignatureError) as error:
        Verifier(SPEC_SECRET).verify(
            SPEC_ID, str(SPEC_TIMESTAMP), SPEC_SIGNATURE, SPEC_BODY, now=SPEC_TIMESTAMP - offset
        )
    assert error.value.replay


def test_verifier_refuses_missing_headers_and_bad_secrets() -> None:
    with pytest.raises(SignatureError):
        Verifier(SPEC_SECRET).verify(SPEC_ID, None, SPEC_SIGNATURE, SPEC_BODY, SPEC_TIMESTAMP)
    with pytest.raises(ValueError, match="base64"):
        Verifier("whsec_not base64!")
    with pytest.raises(ValueError, match="16 key bytes"):
        decode_secret("whsec_" + base64.b64encode(b"short").decode())


def test_breaker_opens_after_consecutive_failures_and_probes_after_cool_down() -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown_seconds=10, max_cooldown_seconds=25)
    assert breaker.allowance(0) is None
    assert not breaker.failed(0)
    assert not breaker.failed(1)
    breaker.succeeded()  # a success in between: the count starts again
    assert not breaker.failed(2)
    assert not breaker.failed(3)
    assert breaker.failed(4)  # the third in a row
    assert breaker.state(5) is BreakerState.OPEN
    assert breaker.allowance(5) == 0
    assert breaker.state(14) is BreakerState.HALF_OPEN
    assert breaker.allowance(14) == 1
    breaker.started(14)
    assert breaker.allowance(14) == 0  # one probe at a time
    assert not breaker.failed(15)  # the probe failed: open again, for twice as long
    assert breaker.state(34) is BreakerState.OPEN
    assert breaker.seconds_until_probe(34) == pytest.approx(1.0)
    assert breaker.state(35) is BreakerState.HALF_OPEN
    breaker.started(35)
    breaker.failed(36)
    assert breaker.current_cooldown == 25  # capped
    breaker.started(61)
    assert breaker.succeeded()  # the endpoint is back
    assert breaker.allowance(61) is None
    assert breaker.current_cooldown == 10
