"""HTTPStore against a live server of kvckpt_web.server.store_routes (the routes ``kvckpt serve --store`` adds):
the shared suite, then the protocol's refusals (a wrong token, oversize bodies, bytes that are not their name, a
manifest naming chunks the server lacks, paths that are no key)."""

from __future__ import annotations

import http.client
import os

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.store_suite import LEASE_RUN_OUT, Clock, StoreTests, run

pytest.importorskip("starlette")

from kvckpt_web.durable.container import MAX_MANIFEST_BYTES  # noqa: E402
from kvckpt_web.durable.keys import chunk_digest, chunk_key
from kvckpt_web.errors import ConflictError, FieldError, FormatError, StoreError  # noqa: E402
from kvckpt_web.server.run import serve_routes_in_thread  # noqa: E402
from kvckpt_web.server.store_routes import StoreRoutes  # noqa: E402
from kvckpt_web.stores.base import Store  # noqa: E402
from kvckpt_web.stores.file import FileStore  # noqa: E402
from kvckpt_web.stores.http import HTTPStore  # noqa: E402

TOKEN = "t" * 24


class AnyKeyRoutes(StoreRoutes):
    """The served store's routes, taking a PUT of any valid key: the shared suite stores keys of its own."""

    def accepts(self, key: str) -> bool:
        return True


class Served:
    """Servers of FileStore directories, one per directory, stopped at the end; ``routes`` serves each."""

    def __init__(self, routes: type[StoreRoutes] = StoreRoutes) -> None:
        self.servers: dict[Path, tuple[Any, str]] = {}
        self.routes = routes

    def url(self, directory: Path, clock: Clock | None = None) -> str:
        """The URL of the server of ``directory``, started on first use, its claims' leases timed by ``clock``."""
        if directory not in self.servers:
            routes = self.routes(FileStore(directory), TOKEN, clock=clock).routes()
            self.servers[directory] = serve_routes_in_thread(routes, port=0)
        return self.servers[directory][1]

    def stop(self) -> None:
        for server, _ in self.servers.values():
            server.shutdown()


@pytest.fixture
def served() -> Any:
    servers = Served()
    yield servers
    servers.stop()


@pytest.fixture
def served_any_key() -> Any:
    servers = Served(AnyKeyRoutes)
    yield servers
    servers.stop()


class TestHTTPStore(StoreTests):
    @pytest.fixture(autouse=True)
    def _servers(self, served_any_key: Served) -> None:
        self.served = served_any_key

    def open_store(self, location: Path, **kwargs: Any) -> Store:
        return HTTPStore(self.served.url(location / "served"), token=TOKEN, **kwargs)

    def open_leased(self, location: Path, clock: Clock) -> Store:
        return HTTPStore(self.served.url(location / "leased", clock), token=TOKEN, clock=clock)


@pytest.fixture
def server(served: Served, tmp_path: Path) -> tuple[str, FileStore]:
    """A served store's URL and the FileStore behind it."""
    return served.url(tmp_path / "served"), FileStore(tmp_path / "served")


def request(url: str, method: str = "GET", body: bytes | None = None, token: str | None = TOKEN,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method, headers=all_headers),
                                    timeout=30) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


CHUNK = b"some chunk bytes"
KEY = chunk_key(chunk_digest(CHUNK))


@pytest.mark.parametrize("token", [None, "x" * 24, TOKEN + "x"])
@pytest.mark.parametrize("method, path", [("GET", "store/keys"), ("GET", f"store/v/{KEY}"), ("HEAD", f"store/v/{KEY}"),
                                          ("PUT", f"store/v/{KEY}")])
def test_a_request_without_the_token_is_401_and_writes_nothing(server, token, method, path):
    url, backing = server
    status, _, headers = request(url + path, method, CHUNK if method == "PUT" else None, token=token)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert run(backing.list_prefix("")) == []


def test_an_httpstore_with_a_wrong_token_says_so_and_writes_nothing(server):
    url, backing = server
    with pytest.raises(StoreError, match="refused the token"):
        run(HTTPStore(url, token="wrong" * 5).set_if_absent(KEY, CHUNK))
    assert run(backing.list_prefix("")) == []


def test_a_chunk_whose_bytes_are_not_its_name_is_refused(server):
    url, backing = server
    status, text, _ = request(url + f"store/v/{KEY}", "PUT", CHUNK + b"!")
    assert status == 400 and b"SHA-256" in text
    assert not run(backing.exists(KEY))


def test_a_value_is_stored_once_and_then_refused_412(server):
    url, backing = server
    assert request(url + f"store/v/{KEY}", "PUT", CHUNK)[0] == 201
    assert request(url + f"store/v/{KEY}", "PUT", CHUNK)[0] == 412
    assert run(backing.get(KEY)) == CHUNK


@pytest.mark.parametrize("key", ["junk/x", ".hidden", "manifests/alpha/00000000000000000002/x", "manifests/alpha",
                                 "chunks/" + "A" * 64, "prefixes/x"])
def test_a_put_of_a_key_the_format_does_not_define_is_refused_naming_it(server, key):
    url, backing = server
    status, text, _ = request(url + f"store/v/{key}", "PUT", CHUNK)
    assert status == 400 and key.encode() in text
    assert run(backing.list_prefix("")) == []


def test_a_body_over_its_keys_limit_is_refused_before_it_is_read(server):
    url, backing = server
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    key = "manifests/chat/00000000000000000001"
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("PUT", f"/store/v/{key}")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Content-Length", str(MAX_MANIFEST_BYTES + 49))
    connection.endheaders()  # no body sent
    answer = connection.getresponse()
    assert answer.status == 413
    connection.close()
    assert not run(backing.exists(key))


def test_a_large_put_body_is_never_held_in_memory_whole(server):
    import tracemalloc

    url, backing = server
    value = os.urandom(16 << 20)
    key = chunk_key(chunk_digest(value))
    tracemalloc.start()
    try:
        status = request(url + f"store/v/{key}", "PUT", value)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 201 and run(backing.get(key)) == value
    assert peak < len(value) // 4


def test_a_put_body_slower_than_its_deadline_is_a_408_and_the_connection_closed(tmp_path):
    import socket

    server, url = serve_routes_in_thread(StoreRoutes(FileStore(tmp_path), TOKEN, body_timeout=0.5).routes(), port=0)
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"PUT /store/v/{KEY} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                         f"Content-Length: {len(CHUNK)}\r\n\r\n".encode() + CHUNK[:1])  # and no more
            answer = b""
            while piece := sock.recv(65536):  # until the server closes the connection
                answer += piece
    finally:
        server.shutdown()
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer.lower()
    assert run(FileStore(tmp_path).list_prefix("")) == []


def test_a_put_without_a_length_is_refused(server):
    url, _ = server
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("PUT", f"/store/v/{KEY}")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    connection.send(b"0\r\n\r\n")
    assert connection.getresponse().status == 411
    connection.close()


@pytest.mark.parametrize("path", ["store/v/../../etc/passwd", "store/v/a//b", "store/v/~kvckpt.lock",
                                  "store/v/%2e%2e/x", "store/v/"])
def test_a_path_that_is_no_store_key_is_404(server, path):
    url, _ = server
    assert request(url + path)[0] == 404


def test_the_lock_file_of_the_directory_behind_is_not_reachable(server):
    url, backing = server
    run(backing.set(KEY, CHUNK))
    async def locked() -> None:
        async with backing.lock():
            pass
    run(locked())  # the lock file exists now
    assert request(url + "store/v/~kvckpt.lock")[0] == 404
    assert request(url + "store/keys")[1] == b'{"keys":["' + KEY.encode() + b'"],"truncated":false}'


def test_a_preflight_is_answered_without_the_token(server):
    url, _ = server
    status, _, headers = request(url + f"store/v/{KEY}", "OPTIONS", token=None,
                                 headers={"Origin": "http://localhost:9", "Access-Control-Request-Method": "PUT"})
    assert status == 204 and "authorization" in headers["access-control-allow-headers"]


def test_another_host_is_refused(server):
    url, _ = server
    assert request(url + "store/keys", headers={"Host": "evil.example"})[0] == 421


def test_a_manifest_naming_chunks_the_server_lacks_is_refused(server, make_model):
    from kvckpt_web.durable.save import save
    from kvckpt_web.stores.memory import MemoryStore

    url, backing = server
    model = make_model()
    model.add(0, 20)
    local = MemoryStore()
    run(save(model.cache, 0, local, "chat", pages_per_chunk=2))
    key = run(local.list_prefix("manifests/"))[0]
    remote = HTTPStore(url, token=TOKEN)
    with pytest.raises(FormatError, match="does not hold"):
        run(remote.set_if_absent(key, run(local.get(key))))
    assert run(backing.list_prefix("")) == []


def test_a_put_body_that_does_not_decode_is_the_clients_fault_400_and_nothing_is_stored(server):
    url, backing = server
    key = "manifests/chat/00000000000000000001"
    status, text, _ = request(url + f"store/v/{key}", "PUT", b"no manifest")
    assert status == 400 and text.startswith(f"Bad Request: {key}: manifest length: expected at least".encode())
    assert run(backing.list_prefix("")) == []


def test_a_damaged_value_the_store_holds_is_a_500_naming_its_key_not_the_clients_400(server, tmp_path):
    url, backing = server
    (tmp_path / "served" / "chunks").mkdir(parents=True)
    (tmp_path / "served" / KEY).symlink_to(tmp_path / "elsewhere")  # no value a FileStore reads: damage
    status, text, _ = request(url + f"store/v/{KEY}")
    assert status == 500 and text.startswith(KEY.encode() + b": expected a regular file")


def test_a_record_of_a_manifest_the_server_lacks_is_refused(server):
    url, backing = server
    key = "prefixes/" + "0" * 32 + "/chat/00000000000000000001"
    with pytest.raises(FormatError):
        run(HTTPStore(url, token=TOKEN).set_if_absent(key, b"{}"))
    assert run(backing.list_prefix("")) == []


def test_an_httpstore_needs_an_http_url_and_a_token():
    with pytest.raises(FieldError) as info:
        HTTPStore("ftp://x/", token=TOKEN)
    assert info.value.field == "url"
    with pytest.raises(FieldError) as info:
        HTTPStore("http://127.0.0.1:9/", token=None)
    assert info.value.field == "token"


def test_a_server_that_is_gone_is_a_store_error():
    with pytest.raises(StoreError, match="no answer"):
        run(HTTPStore("http://127.0.0.1:9/", token=TOKEN).get(KEY))


def test_bytes_read_counts_the_values_fetched(server):
    url, backing = server
    run(backing.set(KEY, CHUNK))
    store = HTTPStore(url, token=TOKEN)
    run(store.get(KEY))
    run(store.get("chunks/" + "0" * 64))
    assert store.bytes_read == len(CHUNK)


def test_a_short_token_is_refused_when_serving():
    from kvckpt_web.server.store_routes import check_token

    with pytest.raises(FieldError) as info:
        check_token("short", "--token")
    assert info.value.field == "--token"



# -- claims -------------------------------------------------------------------------------------------------------


def test_a_claim_through_the_server_and_one_of_a_writer_of_its_directory_exclude_each_other(server):
    url, backing = server
    remote = HTTPStore(url, token=TOKEN).claim("chat")
    run(remote.__aenter__())
    with pytest.raises(ConflictError, match="'chat'"):
        run(backing.claim("chat").__aenter__())
    run(remote.__aexit__(None, None, None))
    local = backing.claim("chat")
    run(local.__aenter__())
    with pytest.raises(ConflictError, match="'chat'"):
        run(HTTPStore(url, token=TOKEN).claim("chat").__aenter__())
    run(local.__aexit__(None, None, None))


def test_a_client_that_died_leaves_the_name_to_writers_of_the_directory_once_its_lease_ran_out(served, tmp_path):
    clock = Clock()
    url = served.url(tmp_path / "served", clock)
    run(HTTPStore(url, token=TOKEN, clock=clock).claim("chat").__aenter__())  # never left: the client was killed
    clock.offset = LEASE_RUN_OUT
    run(HTTPStore(url, token=TOKEN, clock=clock).claim("other").__aenter__())  # any claim request sweeps
    run(FileStore(tmp_path / "served").claim("chat").__aenter__())


@pytest.mark.parametrize("body", [b"", b"{}", b'{"holder": "AB"}', b'{"holder": "' + b"a" * 32 + b'", "x": 1}',
                                  b'{"holder": "' + b"a" * 2000 + b'"}', b"\xff"])
def test_a_claim_request_whose_body_is_no_holder_is_400_and_claims_nothing(server, body):
    url, backing = server
    status, answer, _ = request(f"{url}store/claims/chat", "POST", body)
    assert status == 400 and b"holder" in answer
    run(backing.claim("chat").__aenter__())


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_a_claim_request_without_the_token_is_401_and_claims_nothing(server, method):
    url, backing = server
    status, _, _ = request(f"{url}store/claims/chat?holder={'a' * 32}", method, b'{"holder": "' + b"a" * 32 + b'"}',
                           token=None)
    assert status == 401
    run(backing.claim("chat").__aenter__())


def test_a_claim_of_a_name_that_is_no_key_segment_is_404(server):
    url, _ = server
    status, _, _ = request(f"{url}store/claims/~kvckpt.lock", "POST", b'{"holder": "' + b"a" * 32 + b'"}')
    assert status == 404


def test_a_preflight_of_a_claim_request_allows_its_methods(server):
    url, _ = server
    status, _, headers = request(url + "store/claims/chat", "OPTIONS", token=None,
                                 headers={"Origin": "http://localhost:9", "Access-Control-Request-Method": "POST"})
    assert status == 204 and {"POST", "PUT", "DELETE"} <= set(headers["access-control-allow-methods"].split(", "))
