"""`colibri serve`'s extras beside the OpenAI API: /tokenize and /detokenize (vLLM's shapes), CORS
(--allowed-origins), model aliases (--model-name A,B) and --accept-any-model-name.

- /tokenize gives the ids colibri's Tokenizer gives and, as an outside reference, the ids HF
  `tokenizers` gives with the tiny model's own vocabulary and merges (byte-level BPE, Qwen2's
  pre-tokenizer); token_strs are HF's id_to_token; /detokenize round-trips and matches HF's
  decode. The chat form counts what /v1/chat/completions reports as usage.prompt_tokens.
  Errors: 400 (ids outside the vocabulary, bad bodies), 401 without the key, 404 for an
  unknown model, 413 over the body limit.
- CORS: off by default (no header at all); an allowed origin gets Access-Control-Allow-Origin
  (and Retry-After exposed); a preflight needs no API key while the real request without it is
  a 401; a disallowed origin gets no allow header.
- Aliases: each one served, /v1/models lists them in order, an unknown name is a 404
  (model_not_found); --accept-any-model-name serves any name.

Servers run on the tiny random MoE model (fast to load), as tests/serve/test_serve_tiny.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import llguidance  # noqa: F401
import pytest
from serve_util import REPO, Server, start  # noqa: E402
from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from colibri import Tokenizer  # noqa: E402
from colibri.tokenizer import read_gguf_vocab  # noqa: E402

MODEL = "tiny"
ALIASES = ["tiny", "tiny-alias", "gpt-4o-mini", "other"]  # --model-name tiny,tiny-alias ...
KEY = "extras-key-51e2d84b067f3a9c"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD = "http://good.example:3000"
ALSO = "https://also.example"
EVIL = "http://evil.example"
CTX = 2048
MAX_BODY = 65536
# Qwen2's pre-tokenizer regex (the tiny model's tokenizer.ggml.pre is "qwen2")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = ["hello world", "aa bb cc dd", "  leading spaces and\ttabs\n\nnewlines  ",
         "Grüße, naïve café — 東京 🚀 ok", "it's 12345 o'clock!!", "<|im_start|>not special",
         "x"]




@pytest.fixture(scope="module")
def tok(tiny_path: str) -> Tokenizer:
    return Tokenizer.from_gguf(tiny_path)


@pytest.fixture(scope="module")
def hf(tiny_path: str) -> HFTokenizer:
    """HF `tokenizers` on the tiny model's vocabulary and merges: byte-level BPE with Qwen2's
    split, as llama.cpp's "qwen2" pre-tokenizer (control tokens not added: the text form
    leaves them text)."""
    info = read_gguf_vocab(tiny_path)
    assert info.merges is not None
    tokens = [t.decode("utf-8") if isinstance(t, bytes) else t for t in info.tokens]
    merges = [tuple((m.decode("utf-8") if isinstance(m, bytes) else m).split(" ", 1))
              for m in info.merges]
    h = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    h.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    h.decoder = decoders.ByteLevel()
    return h


def _args(tiny_path: str, *extra: str) -> list[str]:
    return ["-m", tiny_path, "--threads", "2", "--ctx", str(CTX), "--no-prefault",
            "--max-seqs", "2", *extra]


@pytest.fixture(scope="module")
def server(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Aliases (comma-separated and repeated), an API key, two allowed origins, a small body
    limit."""
    srv = start(_args(tiny_path, "--model-name", ",".join(ALIASES[:3]), "--model-name",
                      ALIASES[3], "--api-key", KEY, "--allowed-origins", f"{GOOD}, {ALSO}",
                      "--max-body-bytes", str(MAX_BODY)),
                str(tmp_path_factory.mktemp("serve_extras_a") / "log"), api_key=KEY)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def open_server(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The defaults (no key, no CORS) but --accept-any-model-name."""
    srv = start(_args(tiny_path, "--model-name", MODEL, "--accept-any-model-name"),
                str(tmp_path_factory.mktemp("serve_extras_b") / "log"))
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def _post(srv: Server, path: str, body: Any, headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=AUTH if headers is None else headers,
                      timeout=120)


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    return err


def _chat_prompt_tokens(srv: Server, messages: list[dict], headers: dict[str, str] | None = None,
                        model: str = MODEL) -> int:
    r = _post(srv, "/v1/chat/completions", {"model": model, "messages": messages,
                                            "max_tokens": 1, "temperature": 0}, headers)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


# -- /tokenize, /detokenize -----------------------------------------------------------------

@pytest.mark.slow
def test_tokenize_matches_colibri_and_hf(server: Server, tok: Tokenizer, hf: HFTokenizer):
    for text in TEXTS:
        want = tok.encode(text, add_special=True).tolist()
        assert want == hf.encode(text, add_special_tokens=False).ids, text  # the two agree
        for body in ({"model": MODEL, "prompt": text}, {"prompt": text},
                     {"model": "tiny-alias", "prompt": text, "add_special_tokens": False}):
            r = _post(server, "/tokenize", body)
            assert r.status_code == 200, r.text
            out = r.json()
            assert set(out) == {"count", "max_model_len", "tokens"}, out
            assert out["tokens"] == want, (text, out["tokens"], want)
            assert out["count"] == len(want) and out["max_model_len"] == CTX, out
        r = _post(server, "/tokenize", {"prompt": text, "return_token_strs": True})
        assert r.status_code == 200, r.text
        assert r.json()["token_strs"] == [hf.id_to_token(i) for i in want], text
        # and back: the text itself (the tiny vocabulary is byte-level: lossless), as HF decodes
        r = _post(server, "/detokenize", {"model": MODEL, "tokens": want})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": text}, r.text
        assert hf.decode(want) == text
    r = _post(server, "/tokenize", {"prompt": ""})
    assert r.status_code == 200 and r.json()["tokens"] == [] and r.json()["count"] == 0, r.text


@pytest.mark.slow
def test_detokenize_special_and_partial_utf8(server: Server, tok: Tokenizer):
    eot, im_start = tok.vocab_size - 2, tok.vocab_size - 1  # <|endoftext|>, <|im_start|>
    hello = tok.encode("hello", add_special=False).tolist()
    r = _post(server, "/detokenize", {"tokens": [im_start, *hello, eot]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == "<|im_start|>hello<|endoftext|>"  # as HF's decode: kept
    # the first two bytes of "€" (E2 82 AC): not a whole character, decoded as the model's
    # tokenizer decodes them
    euro = tok.encode("€", add_special=False).tolist()
    assert len(euro) == 3, euro
    r = _post(server, "/detokenize", {"tokens": [*hello, *euro[:2]]})
    assert r.status_code == 200, r.text
    got = r.json()["prompt"]
    assert got == tok.decode([*hello, *euro[:2]], special=True), got
    assert got.startswith("hello") and "\ufffd" in got, got
    assert _post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.slow
def test_tokenize_chat_counts_what_the_chat_endpoint_counts(server: Server):
    convs = [
        [{"role": "user", "content": "aa bb"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
         {"role": "assistant", "content": "hello"},
         {"role": "user", "content": [{"type": "text", "text": "and "},
                                      {"type": "text", "text": "more"}]}],
        [{"role": "developer", "content": "rules"}, {"role": "user", "content": "Grüße 🚀"}],
    ]
    for messages in convs:
        r = _post(server, "/tokenize", {"model": MODEL, "messages": messages})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["count"] == len(out["tokens"]) == _chat_prompt_tokens(server, messages), \
            messages
        assert out["max_model_len"] == CTX
        text = _post(server, "/detokenize", {"tokens": out["tokens"]}).json()["prompt"]
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n"), \
            text
        # without the generation prompt: the same minus "<|im_start|>assistant\n"
        r = _post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
        assert r.status_code == 200, r.text
        bare = r.json()["tokens"]
        assert out["tokens"][:len(bare)] == bare and len(bare) < len(out["tokens"])
        tail = _post(server, "/detokenize", {"tokens": out["tokens"][len(bare):]}).json()
        assert tail["prompt"] == "<|im_start|>assistant\n", tail
    # continue_final_message: the last (assistant) message left open
    msgs = [{"role": "user", "content": "aa"}, {"role": "assistant", "content": "bb cc"}]
    r = _post(server, "/tokenize", {"messages": msgs, "add_generation_prompt": False,
                                    "continue_final_message": True})
    assert r.status_code == 200, r.text
    text = _post(server, "/detokenize", {"tokens": r.json()["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nbb cc"), text
    _error(_post(server, "/tokenize", {"messages": msgs, "continue_final_message": True}), 400,
           "continue_final_message")


@pytest.mark.slow
def test_tokenize_errors(server: Server, tok: Tokenizer):
    n = tok.vocab_size
    for tokens in ([n], [0, -1], [2**70], ["a"], [True], [1.5], "abc", None):
        err = _error(_post(server, "/detokenize", {"tokens": tokens}), 400)
        assert err["param"].split(".")[0] == "tokens", (tokens, err)
    assert str(n) in _error(_post(server, "/detokenize", {"tokens": [n]}), 400)["message"]
    _error(_post(server, "/detokenize", {}), 400, "tokens")
    for body in ({}, {"prompt": 5}, {"prompt": "a", "add_special_tokens": "yes"},
                 {"messages": []}, {"messages": [{"role": "nobody", "content": "x"}]},
                 {"prompt": "a", "messages": [{"role": "user", "content": "x"}]}, [1, 2]):
        _error(_post(server, "/tokenize", body), 400)
    for path in ("/tokenize", "/detokenize"):
        r = httpx.post(server.url + path, content=b"{not json", headers=AUTH, timeout=60)
        _error(r, 400)
        # the model, when named, must be one served
        err = _error(_post(server, path, {"model": "nope", "prompt": "a", "tokens": [1]}), 404,
                     "model")
        assert err["code"] == "model_not_found", err
        # the API key, as on /v1/
        _error(_post(server, path, {"prompt": "a", "tokens": [1]}, headers={}), 401)
        _error(_post(server, path, {"prompt": "a", "tokens": [1]},
                     headers={"Authorization": "Bearer wrong"}), 401)
        # the body limit
        err = _error(_post(server, path, {"prompt": "a" * MAX_BODY, "tokens": [1]}), 413)
        assert err["code"] == "request_too_large", err


# -- CORS -----------------------------------------------------------------------------------

def _preflight(srv: Server, origin: str, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.options(srv.url + path, timeout=60, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def _cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


@pytest.mark.slow
def test_cors_allowed_origin(server: Server):
    for origin in (GOOD, ALSO):
        for path in ("/v1/chat/completions", "/tokenize"):
            # the preflight needs no API key
            r = _preflight(server, origin, path)
            assert r.status_code == 200, (r.status_code, r.text)
            h = _cors_headers(r)
            assert h.get("access-control-allow-origin") == origin, h
            assert "POST" in h.get("access-control-allow-methods", ""), h
            assert "authorization" in h.get("access-control-allow-headers", "").lower(), h
        # the real request without the key: 401, readable by the page (the allow header)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "aa"}],
                "max_tokens": 1}
        r = _post(server, "/v1/chat/completions", body, headers={"Origin": origin})
        _error(r, 401)
        assert r.headers.get("access-control-allow-origin") == origin, r.headers
        # with it: 200, the allow header, Retry-After exposed
        r = _post(server, "/v1/chat/completions", body, headers={**AUTH, "Origin": origin})
        assert r.status_code == 200, r.text
        assert r.headers.get("access-control-allow-origin") == origin, r.headers
        assert "retry-after" in r.headers.get("access-control-expose-headers", "").lower()
        r = httpx.get(server.url + "/v1/models", headers={**AUTH, "Origin": origin}, timeout=60)
        assert r.status_code == 200 and r.headers.get("access-control-allow-origin") == origin
    # a request without Origin (not a browser's): answered as ever, no CORS headers
    r = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=60)
    assert r.status_code == 200 and not _cors_headers(r), r.headers


@pytest.mark.slow
def test_cors_disallowed_origin(server: Server):
    for origin in (EVIL, GOOD + "/", "http://good.example", "https://good.example:3000"):
        r = _preflight(server, origin)
        assert r.status_code != 200, (origin, r.status_code)
        assert "access-control-allow-origin" not in r.headers, (origin, r.headers)
        r = httpx.get(server.url + "/v1/models", headers={**AUTH, "Origin": origin}, timeout=60)
        assert r.status_code == 200, r.text  # served (CORS is the browser's check) ...
        assert "access-control-allow-origin" not in r.headers, (origin, r.headers)  # ... unread


@pytest.mark.slow
def test_cors_is_off_by_default(open_server: Server):
    r = _preflight(open_server, GOOD)
    assert not _cors_headers(r), r.headers
    assert r.status_code != 200, r.status_code  # no preflight handling: OPTIONS is not a route
    for origin in (GOOD, "*", "null"):
        r = httpx.get(open_server.url + "/v1/models", headers={"Origin": origin}, timeout=60)
        assert r.status_code == 200 and not _cors_headers(r), r.headers
        r = _post(open_server, "/tokenize", {"prompt": "aa"}, headers={"Origin": origin})
        assert r.status_code == 200 and not _cors_headers(r), r.headers


@pytest.mark.slow
def test_cors_any_origin(tiny_path: str, tmp_path: Any):
    srv = start(_args(tiny_path, "--model-name", MODEL, "--allowed-origins", "*"),
                str(tmp_path / "log"))
    try:
        r = _preflight(srv, EVIL)
        assert r.status_code == 200, r.text
        assert r.headers.get("access-control-allow-origin") in ("*", EVIL), r.headers
        r = httpx.get(srv.url + "/v1/models", headers={"Origin": EVIL}, timeout=60)
        assert r.headers.get("access-control-allow-origin") in ("*", EVIL), r.headers
    finally:
        assert srv.stop() == 0, srv.log()


# -- model names ----------------------------------------------------------------------------

@pytest.mark.slow
def test_every_alias_is_listed_and_served(server: Server):
    r = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert [c["id"] for c in r.json()["data"]] == ALIASES, r.json()
    msgs = [{"role": "user", "content": "aa bb"}]
    counts = set()
    for name in ALIASES:
        r = httpx.get(server.url + f"/v1/models/{name}", headers=AUTH, timeout=60)
        assert r.status_code == 200 and r.json()["id"] == name, r.text
        counts.add(_chat_prompt_tokens(server, msgs, model=name))
        r = _post(server, "/v1/completions", {"model": name, "prompt": "aa", "max_tokens": 2,
                                              "temperature": 0})
        assert r.status_code == 200, (name, r.text)
        assert r.json()["model"] == MODEL  # the id, whatever alias was named
        r = _post(server, "/v1/chat/completions", {"model": name, "messages": msgs,
                                                   "max_tokens": 2, "stream": True})
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
    assert len(counts) == 1, counts
    # a chunked body (no Content-Length) over the limit is still refused with aliases on
    big = b'{"model": "tiny-alias", "prompt": "' + b"a" * MAX_BODY + b'"}'
    r = httpx.post(server.url + "/v1/completions", timeout=60, headers=AUTH,
                   content=iter([big[:1000], big[1000:]]))
    _error(r, 413)


@pytest.mark.slow
def test_an_unknown_name_is_404(server: Server):
    for name in ("gpt-4o", "tiny-alias2", "TINY", ""):
        for path, body in (("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "aa"}], "max_tokens": 1}),
                           ("/v1/completions", {"prompt": "aa", "max_tokens": 1}),
                           ("/tokenize", {"prompt": "aa"})):
            err = _error(_post(server, path, {"model": name, **body}), 404, "model")
            assert err["code"] == "model_not_found", err
        if name:
            r = httpx.get(server.url + f"/v1/models/{name}", headers=AUTH, timeout=60)
            assert _error(r, 404)["code"] == "model_not_found"


@pytest.mark.slow
def test_accept_any_model_name(open_server: Server):
    r = httpx.get(open_server.url + "/v1/models", timeout=60)
    assert [c["id"] for c in r.json()["data"]] == [MODEL], r.text  # lists only its own name
    msgs = [{"role": "user", "content": "aa bb"}]
    want = _chat_prompt_tokens(open_server, msgs)
    for name in ("gpt-4o", "claude-3-5-sonnet-latest", "some/org:model", ""):
        assert _chat_prompt_tokens(open_server, msgs, model=name) == want, name
        r = _post(open_server, "/v1/completions", {"model": name, "prompt": "aa",
                                                   "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == MODEL, r.text
        r = _post(open_server, "/tokenize", {"model": name, "messages": msgs})
        assert r.status_code == 200 and r.json()["count"] == want, r.text
        if name:
            r = httpx.get(open_server.url + f"/v1/models/{name}", timeout=60)
            assert r.status_code == 200 and r.json()["id"] == name, r.text


# -- the command line -----------------------------------------------------------------------

def _serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLIBRI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "colibri", "serve", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "says"), [
    (["--allowed-origins", "http://good.example/"], "is not an origin"),
    (["--allowed-origins", "good.example"], "is not an origin"),
    (["--allowed-origins", "http://a.example,,http://b.example"], "is not an origin"),
    (["--model-name", "a,,b"], "an empty name"),
    (["--model-name", " "], "an empty name"),
])
def test_bad_names_and_origins_are_one_line_and_exit_1(tiny_path: str, args: list[str],
                                                       says: str):
    p = _serve_cli("-m", tiny_path, "--port", "0", *args)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colibri serve: error: "), p.stderr
    assert says in lines[0] and "listening" not in p.stderr, p.stderr


def test_help_names_the_new_flags():
    p = _serve_cli("--help")
    assert p.returncode == 0, p.stderr
    for flag in ("--allowed-origins", "--accept-any-model-name", "--model-name"):
        assert flag in p.stdout, flag
    text = " ".join(p.stdout.split())
    assert "(default: none: no CORS headers)" in text
    assert "(default: the file's name)" in text


def test_model_names_and_origins_parse():
    from colibri.cli import _model_names, _origins

    assert _model_names(None) == []
    assert _model_names(["a, b", "c", "a"]) == ["a", "b", "c"]
    assert _origins(None) == []
    assert _origins("http://x.example:8080, https://y.example") == [
        "http://x.example:8080", "https://y.example"]
    assert _origins("http://x.example,*") == ["*"]
    assert _origins("chrome-extension://abcdef") == ["chrome-extension://abcdef"]


def test_serving_doc_explains_the_extras():
    from pathlib import Path

    text = (Path(REPO) / "docs" / "SERVING.md").read_text()
    for needle in ("--allowed-origins", "--accept-any-model-name", "--model-name",
                   "POST /tokenize", "POST /detokenize", "add_generation_prompt",
                   "return_token_strs", "max_model_len", "Access-Control-Allow-Origin",
                   "preflight", "tests/serve/test_serve_api_extras.py"):
        assert needle in text, needle
