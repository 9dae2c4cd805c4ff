"""No credential reaches a log line, at any verbosity (lakefuse.cli.logsafe)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli.logsafe import NoCredentials

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "SESSIONTOKENsecretFwoGZXIvYXdzEJr"
KEY_ID = "AKIAEXAMPLEKEYID1234"


def _filtered(msg: str, *args) -> str:
    record = logging.LogRecord("botocore.endpoint", logging.DEBUG, __file__, 1, msg, args, None)
    assert NoCredentials().filter(record)
    return record.getMessage()


def test_botocores_request_headers_lose_their_credentials(monkeypatch):
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    line = _filtered("Sending http request: %s", "<AWSPreparedRequest headers={'X-Amz-Security-Token': b'"
                     + TOKEN + "', 'Authorization': b'AWS4-HMAC-SHA256 Credential=" + KEY_ID
                     + "/20261130/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0a1b2c3d4e5f'}>")
    assert TOKEN not in line and KEY_ID not in line and "0a1b2c3d4e5f" not in line
    assert "X-Amz-Security-Token" in line and "SignedHeaders=host" in line  # the rest stays readable
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)  # and the environment's values, wherever they show
    assert TOKEN not in _filtered("token in another shape: %r", {"tok": TOKEN})
    assert _filtered("nothing secret here: %d files", 3) == "nothing secret here: 3 files"


@pytest.mark.s3
@pytest.mark.parametrize("in_env", [False, True])
def test_a_session_token_or_secret_holding_slashes_is_blanked_whole(monkeypatch, in_env):
    """An STS session token (and a secret key) is base64: it holds "/" and "+", and the field's
    rule stopped at the first "/" -- the rest of a real token went into the log (found by an SRE's
    tour; with the token in the environment too, the rule ran first and cut it in two)."""
    token = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQDsecretTail+AbC/xyz=="
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYsecretKEY"
    if in_env:
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    else:
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    for msg in ("headers={'X-Amz-Security-Token': b'" + token + "', 'Authorization': b'AWS4-HMAC-SHA256 "
                "Credential=" + KEY_ID + "/20261130/us-east-1/s3/aws4_request, Signature=0a1b'}",
                "CanonicalRequest:\nhost:s3\nx-amz-security-token:" + token + "\n",
                "aws_secret_access_key = " + secret):
        line = _filtered(msg)
        assert "secretTail" not in line and "wEa" not in line and "secretKEY" not in line and KEY_ID not in line, line
        assert "***" in line
    assert "/20261130/us-east-1/s3/aws4_request" in _filtered("Credential=" + KEY_ID + "/20261130/us-east-1/s3/aws4_request")


def test_a_urls_user_and_password_are_blanked():
    """Found by a security review: with ``-vv``, botocore's debug lines print the endpoint URL as
    given, ``http://user:password@host`` included, into the (0644) mount log."""
    for msg in ("Setting s3 timeout: {'Endpoint': 'http://admin:EndpointPW77@127.0.0.1:5731'}",
                "Making request for OperationModel(name=HeadBucket) with params: {'url': "
                "'http://admin:EndpointPW77@127.0.0.1:5731/bkt'}",
                "kv postgresql://bob:EndpointPW77@db.example/lakefuse?sslmode=require"):
        line = _filtered(msg)
        assert "EndpointPW77" not in line and "admin" not in line and "bob" not in line, line
        assert "://***@" in line
    # nothing else is taken for one: a user without a password, an "a:b@c" outside a URL's start
    for msg in ("kv postgresql://bob@db.example/x", "see https://example.com/a:b@c", "user a:b@c"):
        assert _filtered(msg) == msg


def test_debug_logging_of_an_s3_command_shows_no_credential(tmp_path, s3_endpoint, s3_bucket):
    """``-vv`` printed the session token and the access key ID (botocore's headers) on stderr,
    and a mount's log file got them too; and the endpoint's user and password (a security review)."""
    assert s3_endpoint.startswith("http://")
    env = {**os.environ, "AWS_SESSION_TOKEN": TOKEN, "AWS_ACCESS_KEY_ID": KEY_ID,
           "LAKEFUSE_S3_ENDPOINT": "http://admin:EndpointPW77@" + s3_endpoint[len("http://"):]}
    home = str(tmp_path / "home")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lakefuse", "-vv", "--home", home, *args], env=env,
                              capture_output=True, text=True, cwd=ROOT, timeout=120)

    r = run("repo", "create", "lakefs://tok", "--storage", f"s3://{s3_bucket}/ns")  # (probes the bucket)
    assert r.returncode == 0, r.stderr
    assert "Sending http request" in r.stderr and "X-Amz-Security-Token" in r.stderr  # (botocore's debug log)
    assert TOKEN not in r.stderr + r.stdout and KEY_ID not in r.stderr + r.stdout
    assert "EndpointPW77" not in r.stderr + r.stdout and "://***@127.0.0.1" in r.stderr


def test_a_tracebacks_text_loses_its_credentials_too():
    """Found by a security tour: at ``-vv`` botocore logs a failed request with its traceback, whose
    last line names the endpoint URL as given (``http://user:password@host``); the message was
    blanked, the traceback written as it was."""
    import io

    try:
        raise ConnectionError('Could not connect to the endpoint URL: "http://epuser:EPPASS123@127.0.0.1:1/bkt"')
    except ConnectionError:
        exc_info = sys.exc_info()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(NoCredentials())
    record = logging.LogRecord("botocore.endpoint", logging.DEBUG, __file__, 1, "Exception received", (), exc_info)
    handler.handle(record)
    text = out.getvalue()
    assert "Traceback" in text and "ConnectionError" in text and "://***@127.0.0.1:1/bkt" in text, text
    assert "EPPASS123" not in text and "epuser" not in text, text
