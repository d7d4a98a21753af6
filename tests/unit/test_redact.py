"""Secrets are replaced in text and in log records."""

from __future__ import annotations

import logging

from skillopt.core.redact import (
    REDACTED,
    RedactingFilter,
    Redactor,
    looks_like_secret,
    secret_values_from_env,
)


def test_values_of_credential_variables_are_redacted_wherever_they_appear():
    env = {"OPENAI_API_KEY": "plainvalue12345", "MY_SERVICE_TOKEN": "tok-abcdefgh", "HOME": "/home/someone"}
    redact = Redactor.from_environment(env)
    text = "key plainvalue12345 token tok-abcdefgh home /home/someone"
    assert redact(text) == f"key {REDACTED} token {REDACTED} home /home/someone"


def test_short_values_are_not_treated_as_secrets():
    assert secret_values_from_env({"SOME_KEY": "1"}) == []


def test_secret_shapes_are_redacted_without_being_known():
    redact = Redactor()
    for secret in ("sk-ant-api03-abcdefghijkl", "sk-proj-abcdefghijklmnop", "Bearer abc.def-ghi",
                   "eyJhbGciOi.eyJzdWIiOiIx.c2lnbmF0dXJl"):
        assert secret not in redact(f"before {secret} after"), secret
        assert looks_like_secret(secret) or secret.startswith("Bearer")


def test_logging_filter_redacts_messages_args_and_tracebacks(caplog):
    logger = logging.getLogger("skillopt.test_redact")
    logger.addFilter(RedactingFilter(Redactor(["SENTINEL-VALUE-123"])))
    with caplog.at_level(logging.INFO, logger="skillopt.test_redact"):
        logger.info("calling with %s", "SENTINEL-VALUE-123")
        try:
            raise RuntimeError("boom SENTINEL-VALUE-123")
        except RuntimeError:
            logger.exception("failed")
    assert "SENTINEL-VALUE-123" not in caplog.text
    assert REDACTED in caplog.text
