"""Range requests (RFC 9110 section 14): one range 206, none satisfiable 416, anything else the whole file."""

from __future__ import annotations

import pytest
from serve_helpers import request, serving

from kvckpt_web.server.ranges import requested_range

BODY = bytes(range(256)) * 4  # 1024 bytes


@pytest.fixture
def url(pyodide):
    (pyodide / "pyodide.asm.wasm").write_bytes(BODY)
    with serving(pyodide) as url:
        yield url


@pytest.mark.parametrize("header, wanted", [
    ("bytes=0-9", range(0, 10)), ("bytes=10-", range(10, 100)), ("bytes=-10", range(90, 100)),
    ("bytes=90-1000", range(90, 100)), ("bytes=-1000", range(0, 100)),
    ("Bytes=5-5", range(5, 6)), ("bytes= 5-5 ,", range(5, 6)), ("bytes=99-99", range(99, 100)),
])
def test_one_range_is_the_bytes_it_names_cut_at_the_end(header, wanted):
    assert requested_range([header], 100) == wanted


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=100-200", "bytes=-0", "bytes=" + "9" * 5000 + "-"])
def test_a_range_past_the_end_or_empty_is_unsatisfiable(header):
    assert requested_range([header], 100) == range(0)


@pytest.mark.parametrize("header", ["bytes=0-", "bytes=-5"])
def test_every_range_of_an_empty_file_is_unsatisfiable(header):
    assert requested_range([header], 0) == range(0)


@pytest.mark.parametrize("header", ["", "bytes", "bytes=", "bytes=-", "bytes=a-b", "bytes=5-3", "bytes=1_0-20",
                                    "bytes=--5", "bytes=+1-2", "bytes=\u0661-2", "items=0-9", "0-9",
                                    "bytes =0-9",
                                    "bytes=0-1,5-6", "bytes=0-1, 0-1"])
def test_a_malformed_foreign_or_multiple_range_is_ignored(header):
    assert requested_range([header], 100) is None


def test_several_range_lines_are_several_ranges_and_ignored():
    assert requested_range(["bytes=0-1", "bytes=5-6"], 100) is None


def test_without_range_the_whole_file_is_answered_and_ranges_are_offered(url):
    status, headers, body = request(url, "/pyodide/pyodide.asm.wasm")
    assert (status, headers["Accept-Ranges"], body) == (200, "bytes", BODY)


@pytest.mark.parametrize("header, first, last", [("bytes=0-9", 0, 9), ("bytes=1000-", 1000, 1023),
                                                 ("bytes=-24", 1000, 1023), ("bytes=1020-5000", 1020, 1023)])
def test_one_range_is_answered_206_with_its_content_range(url, header, first, last):
    status, headers, body = request(url, "/pyodide/pyodide.asm.wasm", {"Range": header})
    assert status == 206 and headers["Content-Range"] == f"bytes {first}-{last}/1024"
    assert headers["Content-Length"] == str(last + 1 - first) and body == BODY[first:last + 1]
    assert headers["Content-Type"] == "application/wasm"


@pytest.mark.parametrize("header", ["bytes=1024-", "bytes=-0", "bytes=5000-6000"])
def test_an_unsatisfiable_range_is_answered_416_with_the_size(url, header):
    status, headers, _ = request(url, "/pyodide/pyodide.asm.wasm", {"Range": header})
    assert status == 416 and headers["Content-Range"] == "bytes */1024"


@pytest.mark.parametrize("header", ["bytes=5-3", "bytes=abc", "lines=0-9", "bytes=0-1,5-6"])
def test_a_malformed_foreign_or_multiple_range_is_answered_200_whole(url, header):
    status, headers, body = request(url, "/pyodide/pyodide.asm.wasm", {"Range": header})
    assert (status, body) == (200, BODY) and "Content-Range" not in headers


def test_head_with_a_range_says_what_get_would_without_a_body(url):
    status, headers, body = request(url, "/pyodide/pyodide.asm.wasm", {"Range": "bytes=0-9"}, method="HEAD")
    assert (status, headers["Content-Range"], headers["Content-Length"], body) == (206, "bytes 0-9/1024", "10", b"")


def test_if_range_with_the_current_etag_answers_the_range(url):
    etag = request(url, "/pyodide/pyodide.asm.wasm", method="HEAD")[1]["ETag"]
    status, _, body = request(url, "/pyodide/pyodide.asm.wasm", {"Range": "bytes=0-9", "If-Range": etag})
    assert (status, body) == (206, BODY[:10])


def test_if_range_with_another_etag_answers_the_whole_file(url):
    status, _, body = request(url, "/pyodide/pyodide.asm.wasm", {"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert (status, body) == (200, BODY)


def test_the_model_file_answers_a_range(pyodide, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(bytes(range(256)) * 4096)  # 1 MiB: more than one chunk
    with serving(pyodide, model=model) as url:
        status, headers, body = request(url, "/model.gguf", {"Range": "bytes=1000-299999"})
    assert status == 206 and headers["Content-Range"] == f"bytes 1000-299999/{2**20}"
    assert body == model.read_bytes()[1000:300000]
