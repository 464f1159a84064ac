"""A real S3-speaking server for tests: moto's server mode (PyPI ``moto[server]``), started on 127.0.0.1.

moto is pure Python, installs offline from PyPI, and answers S3's REST API as AWS does, including the
conditional PUT the object store's commits rest on (``If-None-Match: *`` answered 412 Precondition Failed when
the key holds a value), which ``tests/stores/test_object_store.py`` checks on the wire. It keeps objects in
memory; each test gets its own key prefix in one bucket.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

BUCKET = "kvckpt-tests"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ALLOW_HTTP": "true"}
START_TIMEOUT = 60.0
NO_RETRIES = {"max_retries": 0, "retry_timeout": timedelta(seconds=5),
              "backoff": {"init_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=100),
                          "base": 2}}
"""obstore's retry settings in tests: a request that fails fails at once (obstore retries for 3 minutes)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A moto server process on 127.0.0.1 with one bucket, :data:`BUCKET`."""

    def __init__(self) -> None:
        pytest.importorskip("moto.server", reason="moto[server] (the remote extra's test server) is not installed")
        pytest.importorskip("obstore", reason="obstore (the remote extra) is not installed")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT"),
                                       timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("the moto S3 server did not come up")
                time.sleep(0.1)
        self._prefixes = itertools.count()

    @property
    def env(self) -> dict[str, str]:
        """The environment variables that point an S3 client (and ``s3://`` URLs of kvckpt) at this server."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def new_url(self) -> str:
        """An ``s3://`` URL of a key prefix no test used before."""
        return f"s3://{BUCKET}/t{os.getpid()}-{next(self._prefixes)}"

    def obstore(self, url: str) -> Any:
        """An obstore S3Store of ``url`` on this server (configured directly, not through the environment)."""
        from obstore.store import S3Store

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return S3Store(bucket, prefix=prefix or None, endpoint=self.endpoint, access_key_id="testing",
                       secret_access_key="testing", region="us-east-1", client_options={"allow_http": True},
                       retry_config=NO_RETRIES)

    def store(self, url: str, **kwargs: Any) -> Any:
        """A kvckpt ObjectStore of ``url`` on this server."""
        from kvckpt_web.stores.objects import ObjectStore

        return ObjectStore(self.obstore(url), url=url, **kwargs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    yield server
    server.stop()
