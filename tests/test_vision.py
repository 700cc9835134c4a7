"""Images in (issue 38): a projector file (mmproj) against llama.cpp's libmtmd, recorded by
benches/record_vision.py on the tiny Gemma 3 pair of tests/data/make_tiny_vision.py: the image
embeddings (mtmd_encode_chunk), the chunks of a prompt with media markers (mtmd_tokenize), and
the logits after decoding it (mtmd_helper_eval_chunks), plus the errors of bad input."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

import ferrollama as fl
from ferrollama.generation.multimodal import MEDIA_MARKER, ImageChunk, Projector, TextChunk
from scenario_runner import TOL_TINY_FLOAT_MAX
from vision_pairs import (DATA, Pair, check_embeddings_match_mtmd, check_prompt_matches_mtmd, logits_off_with,
                         pair_fixtures)

PAIR = Pair("vision-gemma3-f32")
SCN = PAIR.scn


image, context = PAIR.image, PAIR.context

model, proj = pair_fixtures(PAIR)


def assert_first_token(model: fl.Model, logits, token: str, logprob: float, tol: float) -> None:  # noqa: ANN001
    """An answer's first token is the greedy one of `logits`, with its log-probability."""
    logits = np.asarray(logits, np.float64)
    top, peak = int(np.argmax(logits)), logits.max()
    assert token == model.token_to_piece(top, True).decode()
    assert abs(logprob - (logits[top] - peak - np.log(np.exp(logits - peak).sum()))) < tol


@pytest.mark.parametrize("name", sorted(SCN["images"]))
def test_image_embeddings_match_mtmd(proj: Projector, name: str) -> None:
    check_embeddings_match_mtmd(proj, PAIR, name, [16], 256)


def test_image_sources_give_the_same_embeddings(proj: Projector) -> None:
    from PIL import Image

    path = image("wide")
    want = proj.encode(path)
    for source in (str(path), path.read_bytes(), Image.open(path), np.asarray(Image.open(path).convert("RGB"))):
        assert np.array_equal(proj.encode(source), want)


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("case", range(len(SCN["evals"])))
def test_prompt_with_images_matches_mtmd(model: fl.Model, proj: Projector, case: int, cache_type: str) -> None:
    _, ctx = check_prompt_matches_mtmd(model, proj, PAIR, case, cache_type, non_causal=True)
    assert ctx.causal_attn  # restored after the image


def test_gemma3_images_are_decoded_non_causally(model: fl.Model, proj: Projector) -> None:
    # mtmd_decode_use_non_causal: the same chunks decoded causally end beyond the tolerance (0.38)
    assert SCN["evals"][0]["expected_non_causal"]

    def causal(c: ImageChunk) -> None:
        assert c.non_causal
        c.non_causal = False

    assert logits_off_with(model, proj, PAIR, causal) > 4 * TOL_TINY_FLOAT_MAX


def test_embeddings_batch_decodes_like_the_projectors_eval(model: fl.Model, proj: Projector) -> None:
    # Batch.from_embeddings is the public way in for embeddings computed elsewhere
    ev = SCN["evals"][0]
    chunks = proj.tokenize(ev["prompt"], [image("square")])
    ctx = context(model)
    n_past = 0
    for c in chunks:
        if isinstance(c, TextChunk):
            ctx.decode(fl.Batch.from_tokens(c.tokens, n_past, 0, "last"))
        else:
            ctx.causal_attn = False
            batch = fl.Batch.from_embeddings(c.embd, n_past, 0, "none")
            assert len(batch) == c.n_tokens and batch.n_embd == model.n_embd and batch.tokens == [0] * c.n_tokens
            ctx.decode(batch)
            ctx.causal_attn = True
        n_past += c.n_pos
    assert np.abs(ctx.logits(-1) - np.asarray(ev["expected_logits_last"])).max() <= TOL_TINY_FLOAT_MAX


def test_marker_count_must_match_the_images(proj: Projector) -> None:
    with pytest.raises(ValueError, match="1 media marker"):
        proj.tokenize(f"one {MEDIA_MARKER} two", [])
    with pytest.raises(ValueError, match="0 media marker"):
        proj.tokenize("none", [image("square")])


def test_a_prompt_starting_with_an_image_gets_bos_before_its_marker(model: fl.Model, proj: Projector) -> None:
    chunks = proj.tokenize(f"{MEDIA_MARKER}after", [image("square")])
    start, end = (model.tokenize(m, add_special=False, parse_special=True) for m in ("<start_of_image>", "<end_of_image>"))
    assert len(start) == len(end) == 1
    assert isinstance(chunks[0], TextChunk) and chunks[0].tokens == [model.bos] + start
    assert isinstance(chunks[1], ImageChunk)
    assert isinstance(chunks[2], TextChunk) and chunks[2].tokens[0] == end[0]


def test_embeddings_batch_errors(model: fl.Model) -> None:
    ctx = context(model)
    with pytest.raises(ValueError, match="model's input width is 256"):
        ctx.decode(fl.Batch.from_embeddings(np.zeros((2, 128), np.float32)))
    with pytest.raises(ValueError, match="whole rows"):
        fl.Batch.from_embeddings(np.zeros((0, 256), np.float32))
    with pytest.raises(ValueError, match="takes no tokens"):
        fl.Batch.from_embeddings(np.zeros((1, 256), np.float32)).add(1, 1, [0], False)
    # non-causal attention needs the whole batch in one micro-batch (llama.cpp asserts it)
    ctx = context(model, n_ubatch=8)
    ctx.causal_attn = False
    with pytest.raises(ValueError, match="one micro-batch"):
        ctx.decode(fl.Batch.from_embeddings(np.zeros((9, 256), np.float32)))
    assert ctx.kv.used == 0
    ctx.decode(fl.Batch.from_embeddings(np.zeros((8, 256), np.float32)))
    assert ctx.kv.used == 8


def test_models_that_cannot_take_embeddings_or_be_non_causal() -> None:
    # (per-layer embeddings take embeddings: test_vision_gemma4.py)
    bert_model = fl.Model(str(DATA / "models" / "tiny-bert-f32.gguf"))
    bert = fl.Context(bert_model, n_ctx=64, n_threads=1)
    with pytest.raises(fl.UnsupportedError, match="embeddings for 'bert'.*encoder"):
        bert.decode(fl.Batch.from_embeddings(np.zeros((1, bert_model.n_embd), np.float32)))
    assert not bert.causal_attn
    with pytest.raises(fl.UnsupportedError, match="encoder"):
        bert.causal_attn = True
    hybrid = fl.Context(fl.Model(str(DATA / "models" / "tiny-qwen35-f32.gguf")), n_ctx=256, n_threads=1)
    with pytest.raises(fl.UnsupportedError, match="recurrent"):
        hybrid.causal_attn = False


def test_projector_file_errors(model: fl.Model, tmp_path: Path) -> None:
    with pytest.raises(fl.GGUFError, match="'clip'"):
        Projector(model, PAIR.model_path)
    narrow = fl.Model(str(DATA / "models" / "tiny-qwen35-f32.gguf"))  # n_embd 64
    with pytest.raises(ValueError, match="not a pair"):
        Projector(narrow, PAIR.mmproj)
    with pytest.raises(fl.GGUFError):
        Projector(model, tmp_path / "missing.gguf")
    unknown = rewritten(tmp_path, {"clip.vision.n_wa_pattern": 4})
    with pytest.raises(fl.UnsupportedError, match="clip.vision.n_wa_pattern"):
        Projector(model, unknown)
    other_type = rewritten(tmp_path, {"clip.projector_type": "qwen2.5vl-not-yet"})
    with pytest.raises(fl.UnsupportedError, match="projector type"):
        Projector(model, other_type)


def test_pixels_of_the_wrong_size_are_refused(proj: Projector) -> None:
    with pytest.raises(ValueError, match="64x64"):
        proj.core.encode_pixels(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(ny, nx, 3\)"):
        proj.core.encode_pixels(np.zeros((64, 64, 4), np.float32))


def rewritten(tmp_path: Path, changes: dict, mmproj: Path = PAIR.mmproj) -> Path:
    """A projector (the tiny one by default) with metadata values (strings, integers, integer lists)
    added, replaced or (None) removed."""
    src = gguf.GGUFReader(mmproj)
    out = tmp_path / f"mmproj-{len(list(tmp_path.iterdir()))}.gguf"
    w = gguf.GGUFWriter(str(out), "clip")
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in changes:
            continue
        value = f.contents()
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, vtype)
    for key, value in changes.items():
        if value is None:
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_uint32(key, value)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(n) for n in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shutil.copystat(mmproj, out)
    return out


def data_uri(path: Path) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def chat_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_llama_chat_with_images_decodes_the_template_text_with_the_images(model: fl.Model, proj: Projector) -> None:
    from ferrollama.chat.media import with_media_markers
    from ferrollama.llama_chat_format import MTMDChatHandler

    handler = MTMDChatHandler(clip_model_path=str(PAIR.mmproj))
    llm = fl.Llama(str(PAIR.model_path), n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2,
                   chat_handler=handler, verbose=False)
    # square, then wide (the text before the image is reused), then square again, as a path
    for name, url in (("square", data_uri(image("square"))), ("wide", data_uri(image("wide"))),
                      ("square", str(image("square")))):
        messages = chat_message(url)
        r = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0, logprobs=True, top_logprobs=1)
        text = llm.chat_template.apply(with_media_markers(messages), add_generation_prompt=True)
        ctx = context(model)
        n_past = proj.eval(ctx, text, [image(name)])
        got = r["choices"][0]["logprobs"]["content"][0]
        assert_first_token(model, ctx.logits(-1), got["token"], got["logprob"], 1e-4)
        assert r["usage"]["prompt_tokens"] == n_past


def test_image_parts_without_a_projector_are_refused() -> None:
    llm = fl.Llama(str(PAIR.model_path), n_ctx=256, verbose=False)
    with pytest.raises(ValueError, match="MTMDChatHandler"):
        llm.create_chat_completion(messages=chat_message(str(image("square"))), max_tokens=1)


# --- the server (--mmproj): image_url parts through the official openai client ----------------------


@pytest.fixture(scope="module")
def vision_server(model: fl.Model, proj: Projector):
    from serving import start_server

    server, scheduler = start_server(model, n_seq=2, n_ctx=512, projector=proj)
    yield server, scheduler
    server.stop()
    scheduler.close()


def first_token(r) -> tuple[str, float]:  # noqa: ANN001
    lp = r.choices[0].logprobs.content[0]
    return lp.token, lp.logprob


def test_server_chat_with_an_image_decodes_it_in_the_slot(model: fl.Model, proj: Projector, vision_server) -> None:
    import openai
    from ferrollama.chat.templates import ChatTemplate

    client = openai.OpenAI(base_url=vision_server[0].url + "/v1", api_key="none", max_retries=0, timeout=60)
    template = ChatTemplate.from_model(model)
    for name, cached_at_least in (("square", 0), ("wide", 1), ("wide", 16)):
        messages = chat_message(data_uri(image(name)))
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                                           top_logprobs=1)
        text = template.apply([{"role": "user", "content": f"What is in this picture?{MEDIA_MARKER}"}])
        ctx = context(model, "f16")
        n_past = proj.eval(ctx, text, [image(name)])
        assert_first_token(model, ctx.logits(-1), *first_token(r), 1e-2)
        assert r.usage.prompt_tokens == n_past
        # the same image again: its slot's cache is reused through the image
        assert r.usage.prompt_tokens_details.cached_tokens >= cached_at_least


def test_server_responses_take_input_image_parts(vision_server) -> None:
    import openai

    client = openai.OpenAI(base_url=vision_server[0].url + "/v1", api_key="none", max_retries=0, timeout=60)
    content = [{"type": "input_text", "text": "What is in this picture?"},
               {"type": "input_image", "image_url": data_uri(image("square"))}]
    r = client.responses.create(model="m", input=[{"role": "user", "content": content}], max_output_tokens=2,
                                temperature=0)
    chat = client.chat.completions.create(model="m", messages=chat_message(data_uri(image("square"))), max_tokens=2,
                                          temperature=0)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}], max_output_tokens=2)


def test_server_serves_image_and_text_requests_at_once(vision_server) -> None:
    # two slots, four requests: images wait for a slot, are decoded beside other slots' tokens
    import concurrent.futures

    import httpx

    def ask(content) -> dict:  # noqa: ANN001
        body = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": content}]}
        r = httpx.post(vision_server[0].url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    contents = [chat_message(data_uri(image("square")))[0]["content"], "Say something.",
                chat_message(data_uri(image("wide")))[0]["content"], chat_message(data_uri(image("square")))[0]["content"]]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, contents))
    alone = [ask(c) for c in contents]
    for together, single in zip(answers, alone):
        assert together["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
        assert together["choices"][0]["finish_reason"] == single["choices"][0]["finish_reason"] == "length"
    assert answers[0]["usage"]["prompt_tokens"] == answers[3]["usage"]["prompt_tokens"] > answers[1]["usage"]["prompt_tokens"]


def test_server_refuses_bad_images_and_stays_usable(vision_server, tmp_path: Path) -> None:
    import httpx

    def post(url: str) -> httpx.Response:
        body = {"model": "m", "max_tokens": 1, "messages": chat_message(url)}
        return httpx.post(vision_server[0].url + "/v1/chat/completions", json=body, timeout=60)

    closed = socket_port()
    for url, code in (("data:image/png;base64,bm90IGFuIGltYWdl", "invalid_image"),
                      (f"http://127.0.0.1:{closed}/picture.png", "invalid_image"),
                      (str(image("square")), "invalid_image"),
                      ("ftp://example.invalid/x.png", "invalid_image")):
        r = post(url)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (url, r.text)
    r = post(data_uri(image("square")))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_server_without_a_projector_refuses_images(model: fl.Model) -> None:
    import httpx
    from serving import start_server

    server, scheduler = start_server(model, n_seq=1, n_ctx=256)
    try:
        body = {"model": "m", "max_tokens": 1, "messages": chat_message(data_uri(image("square")))}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and "--mmproj" in r.json()["error"]["message"]
    finally:
        server.stop()
        scheduler.close()


def socket_port() -> int:
    """A port of 127.0.0.1 nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the command line: ferrollama chat --mmproj --image (llama-mtmd-cli) ---------------------------


def ferrollama_cli(*args: str, stdin: str | None = None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ferrollama.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=120)


def greedy_after(model: fl.Model, proj: Projector, text: str, images: list, n: int) -> str:
    ctx = context(model, "f16", n_batch=2048, n_ubatch=512)
    n_past = proj.eval(ctx, text, images)
    out = []
    for _ in range(n):
        token = int(np.argmax(ctx.logits(-1)))
        if model.is_eog(token):
            break
        out.append(model.token_to_piece(token, False))
        ctx.decode(fl.Batch.from_tokens([token], n_past, 0))
        n_past += 1
    return b"".join(out).decode(errors="replace")  # a character may take several byte tokens


def cli_chat_args(pair: Pair, n_ctx: int = 256) -> list[str]:
    """`ferrollama chat` on a pair: greedy, 6 tokens at most."""
    return ["chat", "-m", str(pair.model_path), "--mmproj", str(pair.mmproj), "-c", str(n_ctx), "-n", "6",
            "--temp", "0", "-t", "2"]


def check_cli_answers_as_the_projector_api(model: fl.Model, proj: Projector, pair: Pair, flag: str, media: Path,
                                           n_ctx: int = 256) -> tuple:
    """`ferrollama chat <flag> <media> -p "Tell me"` answers the greedy tokens after the projector's
    decode of the chat template's text. Returns the run and that text."""
    from ferrollama.chat.templates import ChatTemplate

    r = ferrollama_cli(*cli_chat_args(pair, n_ctx), flag, str(media), "-p", "Tell me")
    assert r.returncode == 0, r.stderr
    # llama-mtmd-cli puts the marker before the text it does not place
    text = ChatTemplate.from_model(model).apply([{"role": "user", "content": MEDIA_MARKER + "Tell me"}])
    assert r.stdout.strip("\n") == greedy_after(model, proj, text, [media], 6).strip("\n")
    return r, text


def test_cli_chat_with_an_image_answers_as_the_projector_api(model: fl.Model, proj: Projector) -> None:
    r, text = check_cli_answers_as_the_projector_api(model, proj, PAIR, "--image", image("wide"))
    n_prompt = sum(c.n_pos for c in proj.tokenize(text, [image("wide")]))
    assert re.search(rf"prompt eval time = .*/\s+{n_prompt} tokens", r.stderr), r.stderr
    # /image in a conversation, then the message it goes with
    r = ferrollama_cli(*cli_chat_args(PAIR), stdin=f"/image {image('square')}\nTell me\n")
    assert r.returncode == 0 and "image loaded" in r.stderr, r.stderr


def test_cli_image_errors() -> None:
    base = ["chat", "-m", str(PAIR.model_path), "-c", "256", "-n", "2"]
    r = ferrollama_cli(*base, "--image", str(image("square")), "-p", "hi")
    assert r.returncode != 0 and "--mmproj" in r.stderr
    r = ferrollama_cli(*base, "--mmproj", str(PAIR.mmproj), "--image", str(DATA / "nope.png"), "-p", "hi")
    assert r.returncode != 0 and "nope.png" in r.stderr
    r = ferrollama_cli(*base, "--mmproj", str(PAIR.model_path))
    assert r.returncode != 0 and "--mmproj" in r.stderr and "clip" in r.stderr


def test_mtmd_handler_loads_image_urls_as_llama_cpp_python(tmp_path: Path) -> None:
    from ferrollama.llama_chat_format import MTMDChatHandler

    handler = MTMDChatHandler(clip_model_path=str(PAIR.mmproj))
    raw = image("square").read_bytes()
    assert handler.load_image(data_uri(image("square"))) == raw
    assert handler.load_image(str(image("square"))) == raw
    assert handler.get_image_urls(chat_message("data:x") + [{"role": "user", "content": "text"}]) == ["data:x"]


def test_llama_with_a_drafter_answers_image_chats_without_drafts(model: fl.Model) -> None:
    from ferrollama.llama_chat_format import MTMDChatHandler

    def answer(**kw) -> dict:  # noqa: ANN003
        llm = fl.Llama(str(PAIR.model_path), n_ctx=256, n_threads=2, verbose=False,
                       chat_handler=MTMDChatHandler(clip_model_path=str(PAIR.mmproj)), **kw)
        r = llm.create_chat_completion(messages=chat_message(data_uri(image("wide"))), max_tokens=6, temperature=0)
        return r["choices"][0]["message"], llm.speculative_stats

    plain, _ = answer()
    drafted, stats = answer(draft_model=fl.PromptLookupDecoding(num_pred_tokens=4))
    assert drafted == plain and stats.n_drafted == 0
