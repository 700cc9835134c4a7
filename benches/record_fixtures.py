#!/usr/bin/env python3
"""Records llama.cpp's behaviour on the real models into tests/data/fixtures/.

Everything goes through llama-cpp-python's low-level API (the ctypes bindings of
llama.h: llama_tokenize, llama_decode, llama_sampler_*, llama_chat_apply_template),
except the Jinja rendering of chat templates, which uses llama-cpp-python's
Jinja2ChatFormatter (llama.cpp's own Jinja engine is C++ in common/, not in libllama).
The runs are deterministic: greedy or seeded sampling, fixed settings, 2 threads.

  python benches/record_fixtures.py [--model-dir DIR] [--out tests/data/fixtures]

Files written (see tests/data/fixtures/README.md):
  greedy_<model>.json, chat_templates.json, sampler_chain_qwen2.5-coder-0.5b.json,
  perplexity.json
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as B  # noqa: E402

QWEN, GEMMA = "qwen2.5-coder-0.5b", "gemma-3-270m"
PLAIN_PROMPTS = ["def is_prime(n):\n", "The capital of France is"]
CHAT_PROMPT = [{"role": "user", "content": "Write a haiku about Rust."}]
CONVERSATION = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is a KV cache?"},
    {"role": "assistant", "content": "It stores the keys and values of past tokens so they are not recomputed."},
    {"role": "user", "content": "Why does it grow with the context?"},
]
N_GREEDY = 32
N_SAMPLED = 16
TOP_LOGITS = 64
THREADS = 2
LLAMA_CPP_BUILD = "0c1e570 (vendored by llama-cpp-python 0.3.36)"
#: what llama.cpp's tools (common/chat.cpp) fall back to for a GGUF without tokenizer.chat_template
CHATML_JINJA = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


class Recorder:
    """One model loaded in llama.cpp, with the few calls the fixtures need."""

    def __init__(self, engine: B.LlamaCppEngine, path: Path) -> None:
        self.L = engine.L
        self.path = path
        self.model = engine.load(path)
        self.vocab = self.model.vocab
        self.n_vocab = self.model.n_vocab

    # ---- vocabulary
    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (ctypes.c_int32 * cap)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"tokenize needs {-n} slots")
        return list(buf[:n])

    def piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            raise RuntimeError("piece longer than 256 bytes")
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        arr = (ctypes.c_int32 * max(1, len(tokens)))(*tokens)
        cap = 64 + 64 * len(tokens)
        buf = ctypes.create_string_buffer(cap)
        n = self.L.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, remove_special, unparse_special)
        if n < 0:
            raise RuntimeError("detokenize buffer too small")
        return buf.raw[:n].decode("utf-8", "replace")

    def meta_str(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = self.L.llama_model_meta_val_str(self.model.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8") if n >= 0 else None

    def is_eog(self, token: int) -> bool:
        return bool(self.L.llama_vocab_is_eog(self.vocab, token))

    # ---- chat templates
    def gguf_chat_template(self) -> str | None:
        t = self.L.llama_model_chat_template(self.model.ptr, None)
        return t.decode("utf-8") if t else None

    def chat_template(self) -> str:
        """The GGUF's template, or chatml when it has none (llama.cpp's tools do the same)."""
        return self.gguf_chat_template() or CHATML_JINJA

    def builtin_template_name(self) -> str:
        return self.gguf_chat_template() or "chatml"

    def apply_template_builtin(self, messages: list[dict], add_ass: bool, name: str | None = None) -> str:
        """llama_chat_apply_template: llama.cpp detects which built-in format the template
        (or the built-in format called name) is."""
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        chat = (self.L.llama_chat_message * len(keep))(*[self.L.llama_chat_message(r, c) for r, c in keep])
        tmpl = (name or self.builtin_template_name()).encode()
        cap = 4096
        buf = ctypes.create_string_buffer(cap)
        n = self.L.llama_chat_apply_template(tmpl, chat, len(keep), add_ass, buf, cap)
        if n < 0:
            raise RuntimeError("llama_chat_apply_template: template not supported")
        if n > cap:
            buf = ctypes.create_string_buffer(n)
            n = self.L.llama_chat_apply_template(tmpl, chat, len(keep), add_ass, buf, n)
        return buf.raw[:n].decode("utf-8")

    def apply_template_jinja(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The GGUF's Jinja template run by llama-cpp-python's Jinja2ChatFormatter."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = self.piece(self.model.bos, True).decode("utf-8")
        eos = self.piece(self.L.llama_vocab_eos(self.vocab), True).decode("utf-8")
        fmt = Jinja2ChatFormatter(self.chat_template(), eos_token=eos, bos_token=bos,
                                  add_generation_prompt=add_generation_prompt)
        return fmt(messages=messages).prompt

    def prompt_from_chat(self, messages: list[dict]) -> str:
        """The Jinja rendering, less a leading BOS text when the tokenizer adds BOS anyway
        (what llama.cpp's common/chat.cpp does before tokenizing)."""
        text = self.apply_template_jinja(messages, True)
        bos = self.piece(self.model.bos, True).decode("utf-8")
        if self.model.add_bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    # ---- compute
    def context(self, **kw):  # noqa: ANN003
        return self.model.context(n_threads=THREADS, **kw)

    def logits(self, ctx, i: int = -1) -> np.ndarray:  # noqa: ANN001
        ptr = self.L.llama_get_logits_ith(ctx.ptr, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def decode_tokens(self, ctx, tokens: list[int], pos0: int, all_logits: bool = False) -> None:  # noqa: ANN001
        batch = ctx.batch(len(tokens), 1)
        try:
            flags = [True] * len(tokens) if all_logits else [False] * (len(tokens) - 1) + [True]
            batch.fill(tokens, list(range(pos0, pos0 + len(tokens))), [0] * len(tokens), flags)
            ctx.decode(batch)
        finally:
            batch.close()

    def close(self) -> None:
        self.model.close()


def top(logits: np.ndarray, k: int) -> dict:
    """The k largest logits, largest first (ties: lower id first, as a stable sort gives)."""
    order = np.argsort(-logits, kind="stable")[:k]
    return {"ids": [int(i) for i in order], "logits": [float(logits[i]) for i in order]}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def model_meta(rec: Recorder) -> dict:
    return {"file": rec.path.name, "sha256": sha256(rec.path), "n_vocab": rec.n_vocab,
            "add_bos": rec.model.add_bos, "bos": rec.model.bos,
            "eos": int(rec.L.llama_vocab_eos(rec.vocab))}


def context_meta(ctx, **extra) -> dict:  # noqa: ANN001, ANN003
    return {"n_ctx": ctx.n_ctx, "type_k": "f16", "type_v": "f16", "flash_attn": f"auto ({ctx.flash_attn})",
            "n_threads": THREADS, **extra}


# --------------------------------------------------------------------------- (a) greedy


def greedy_case(rec: Recorder, prompt: str, kind: str) -> dict:
    L = rec.L
    ctx = rec.context(n_ctx=512, n_batch=512, n_ubatch=512, kv_unified=False)
    tokens = rec.tokenize(prompt, add_special=True, parse_special=True)
    rec.decode_tokens(ctx, tokens, 0)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    out, steps = [], []
    try:
        for step in range(N_GREEDY):
            logits = rec.logits(ctx)
            t = top(logits, 5)
            tok = int(L.llama_sampler_sample(chain, ctx.ptr, -1))
            assert tok == t["ids"][0], "greedy must pick the first maximum"
            steps.append({"top5": t, "margin": t["logits"][0] - t["logits"][1]})
            out.append(tok)
            if rec.is_eog(tok):
                break
            rec.decode_tokens(ctx, [tok], len(tokens) + step)
    finally:
        L.llama_sampler_free(chain)
        meta = context_meta(ctx, n_batch=512, n_ubatch=512, swa_full=False)
        ctx.close()
    return {
        "kind": kind, "prompt": prompt, "tokenize": {"add_special": True, "parse_special": True},
        "prompt_tokens": tokens, "generated_tokens": out, "stopped_on_eog": bool(out and rec.is_eog(out[-1])),
        "text": rec.detokenize(out), "pieces": [rec.piece(t, False).decode("utf-8", "replace") for t in out],
        "steps": steps, "context": meta,
    }


def record_greedy(rec: Recorder, short: str) -> dict:
    cases = [greedy_case(rec, p, "plain") for p in PLAIN_PROMPTS]
    chat_prompt = rec.prompt_from_chat(CHAT_PROMPT)
    case = greedy_case(rec, chat_prompt, "chat")
    case["messages"] = CHAT_PROMPT
    case["rendered_by"] = ("Jinja2ChatFormatter(GGUF tokenizer.chat_template"
                           + ("" if rec.gguf_chat_template() else "; this GGUF has none: chatml, llama.cpp's fallback")
                           + "), add_generation_prompt=True, leading BOS text removed when the vocab adds BOS")
    cases.append(case)
    return {"model": model_meta(rec), "recorded_with": LLAMA_CPP_BUILD, "max_new_tokens": N_GREEDY,
            "sampler": "greedy (llama_sampler_init_greedy)", "cases": cases}


# --------------------------------------------------------------------------- (b) chat templates


def record_templates(rec: Recorder) -> dict:
    builtin = rec.apply_template_builtin(CONVERSATION, True)
    jinja = rec.apply_template_jinja(CONVERSATION, True)
    doc = {"model": model_meta(rec), "gguf_template": rec.gguf_chat_template(),
           "template_used": rec.chat_template() if rec.gguf_chat_template() else "chatml (fallback: the GGUF has no tokenizer.chat_template)",
           "llama_chat_apply_template": builtin, "jinja2": jinja, "same": builtin == jinja,
            "jinja2_tokens": rec.tokenize(jinja, add_special=False, parse_special=True)}
    if rec.gguf_chat_template() is None:
        doc["fallback_jinja_source"] = CHATML_JINJA
        arch = rec.meta_str("general.architecture")
        if arch and arch.startswith("gemma"):
            # for information: the turn format of the instruction-tuned Gemma models
            doc["llama_chat_apply_template_gemma_builtin"] = rec.apply_template_builtin(CONVERSATION, True, "gemma")
    return doc


# --------------------------------------------------------------------------- (c) sampler chain


def default_chain(L, n_vocab: int):  # noqa: ANN001
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for s in [L.llama_sampler_init_penalties(n_vocab, 64, 1.0, 0.0, 0.0),
              L.llama_sampler_init_top_k(40),
              L.llama_sampler_init_typical(1.0, 1),
              L.llama_sampler_init_top_p(0.95, 1),
              L.llama_sampler_init_min_p(0.05, 1),
              L.llama_sampler_init_temp(0.8),
              L.llama_sampler_init_dist(42)]:
        L.llama_sampler_chain_add(chain, s)
    return chain


def apply_chain(L, chain, logits: np.ndarray) -> tuple[list[dict], int]:  # noqa: ANN001
    """llama_sampler_apply on an unsorted array with ids 0..n-1 and p = 0 (what
    llama_sampler_sample builds): the candidates left, in llama.cpp's order, and the selected index."""
    data = np.zeros(len(logits), dtype=TOKEN_DATA)
    data["id"] = np.arange(len(logits), dtype=np.int32)
    data["logit"] = logits
    arr = L.llama_token_data_array(
        data=data.ctypes.data_as(L.llama_token_data_p), size=len(logits), selected=-1, sorted=False)
    L.llama_sampler_apply(chain, ctypes.byref(arr))
    n = arr.size
    view = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_uint8)), shape=(n * TOKEN_DATA.itemsize,))
    left = np.frombuffer(view.tobytes(), dtype=TOKEN_DATA, count=n)
    cands = [{"id": int(c["id"]), "logit": float(c["logit"]), "p": float(c["p"])} for c in left]
    return cands, int(arr.selected)


def check_top_logits_suffice(L, n_vocab: int, steps: list[dict]) -> None:  # noqa: ANN001
    """A fresh chain fed arrays rebuilt from the recorded top logits (the rest set far below)
    must pick the same tokens: the README promises tests they can do exactly that."""
    chain = default_chain(L, n_vocab)
    try:
        for s in steps:
            t = s["top_logits"]
            logits = np.full(n_vocab, min(t["logits"]) - 100.0, dtype=np.float32)
            logits[t["ids"]] = np.array(t["logits"], dtype=np.float32)
            cands, selected = apply_chain(L, chain, logits)
            assert cands[selected]["id"] == s["token"], "top logits do not decide the sample"
            L.llama_sampler_accept(chain, s["token"])
    finally:
        L.llama_sampler_free(chain)


def record_sampler(rec: Recorder) -> dict:
    L = rec.L
    prompt = PLAIN_PROMPTS[0]
    ctx = rec.context(n_ctx=512, n_batch=512, n_ubatch=512, kv_unified=False)
    tokens = rec.tokenize(prompt, add_special=True, parse_special=True)
    rec.decode_tokens(ctx, tokens, 0)
    chain = default_chain(L, rec.n_vocab)
    steps = []
    try:
        for step in range(N_SAMPLED):
            logits = rec.logits(ctx)
            probe = L.llama_sampler_clone(chain)  # same RNG state: shows what the chain leaves
            try:
                cands, selected = apply_chain(L, probe, logits)
            finally:
                L.llama_sampler_free(probe)
            tok = int(L.llama_sampler_sample(chain, ctx.ptr, -1))  # sample + accept
            assert tok == cands[selected]["id"], "the clone and the chain must agree"
            steps.append({"token": tok, "top_logits": top(logits, TOP_LOGITS),
                          "candidates_after_chain": cands, "selected_index": selected})
            if step == 0:
                first = {"sum": float(logits.astype(np.float64).sum()), "min": float(logits.min()),
                         "max": float(logits.max()), "argmax": int(logits.argmax())}
            rec.decode_tokens(ctx, [tok], len(tokens) + step)
    finally:
        L.llama_sampler_free(chain)
        meta = context_meta(ctx, n_batch=512, n_ubatch=512, swa_full=False)
        ctx.close()
    out = [s["token"] for s in steps]
    check_top_logits_suffice(L, rec.n_vocab, steps)
    return {
        "model": model_meta(rec), "recorded_with": LLAMA_CPP_BUILD, "prompt": prompt,
        "tokenize": {"add_special": True, "parse_special": True}, "prompt_tokens": tokens,
        "chain": [["penalties", {"last_n": 64, "repeat": 1.0, "freq": 0.0, "present": 0.0}],
                  ["top_k", {"k": 40}], ["typical", {"p": 1.0, "min_keep": 1}],
                  ["top_p", {"p": 0.95, "min_keep": 1}], ["min_p", {"p": 0.05, "min_keep": 1}],
                  ["temp", {"t": 0.8}], ["dist", {"seed": 42}]],
        "procedure": "for each step: logits of the last token -> llama_sampler_sample(chain) (apply, select, accept) -> decode the token",
        "tokens": out, "text": rec.detokenize(out), "first_step_logits_summary": first,
        "steps": steps, "context": meta,
    }


# --------------------------------------------------------------------------- (d) perplexity


def log_softmax_nll(logits: np.ndarray, tok: int) -> float:
    """-(log softmax)[tok] as llama-perplexity computes it: float differences, expf, double sum."""
    mx = logits.max()
    sum_exp = np.exp(logits - mx, dtype=np.float32).astype(np.float64).sum()
    return -(float(logits[tok]) - float(mx) - math.log(sum_exp))


def record_perplexity(rec: Recorder, text: str, n_ctx: int = 128, n_batch: int = 2048) -> dict:
    """llama-perplexity's default method (no stride): chunks of n_ctx tokens, each starting
    with BOS when the vocab adds it, the first half of each chunk not scored. Like the tool,
    n_batch // n_ctx chunks go into one batch as separate sequences (n_seq_max = 16,
    n_ctx of the context = 16 * n_ctx, non-unified cache)."""
    tokens = rec.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:
        return {"model": model_meta(rec), "error": f"{len(tokens)} tokens: llama-perplexity needs at least {2 * n_ctx}",
                "n_tokens": len(tokens)}
    n_chunk = len(tokens) // n_ctx
    n_seq = max(1, n_batch // n_ctx)
    first = n_ctx // 2
    ctx = rec.context(n_ctx=n_seq * n_ctx, n_batch=min(n_batch, n_seq * n_ctx), n_ubatch=512,
                      n_seq_max=n_seq, kv_unified=False)
    L = rec.L
    chunks, nll, count = [], 0.0, 0
    try:
        for i in range(0, n_chunk, n_seq):
            n_seq_batch = min(n_seq, n_chunk - i)
            toks, pos, seq, flags = [], [], [], []
            for s in range(n_seq_batch):
                start = (i + s) * n_ctx
                part = tokens[start:start + n_ctx]
                if rec.model.add_bos:
                    part = [rec.model.bos] + part[1:]
                toks += part
                pos += list(range(n_ctx))
                seq += [s] * n_ctx
                flags += [p >= first for p in range(n_ctx)]
            batch = ctx.batch(len(toks), 1)
            batch.fill(toks, pos, seq, flags)
            L.llama_memory_clear(ctx.mem, True)
            ctx.decode(batch)
            batch.close()
            for s in range(n_seq_batch):
                start = (i + s) * n_ctx
                ptr = L.llama_get_logits_ith(ctx.ptr, s * n_ctx + first)
                rows = np.ctypeslib.as_array(ptr, shape=((n_ctx - first) * rec.n_vocab,)).reshape(n_ctx - first, rec.n_vocab)
                chunk_nll = [log_softmax_nll(rows[j], tokens[start + first + j + 1]) for j in range(n_ctx - 1 - first)]
                nll += sum(chunk_nll)
                count += len(chunk_nll)
                chunks.append({"chunk": i + s + 1, "first_token": start, "nll_sum": sum(chunk_nll),
                               "n_scored": len(chunk_nll), "ppl_chunk": math.exp(sum(chunk_nll) / len(chunk_nll)),
                               "ppl_running": math.exp(nll / count),
                               "printed": f"[{i + s + 1}]{math.exp(nll / count):.4f}"})
    finally:
        meta = context_meta(ctx, n_batch=min(n_batch, n_seq * n_ctx), n_ubatch=512, n_seq_max=n_seq,
                            kv_unified=False, swa_full=False)
        ctx.close()
    return {"model": model_meta(rec), "n_ctx": n_ctx, "n_tokens": len(tokens), "n_chunk": n_chunk,
            "tokenize": {"add_special": True, "parse_special": False}, "tokens": tokens,
            "chunks": chunks, "ppl": math.exp(nll / count), "context": meta}


# --------------------------------------------------------------------------- main


def texts_concatenated(repo: Path) -> tuple[str, list[str]]:
    files = sorted((repo / "tests" / "data" / "texts").glob("*.txt"))
    return "".join(f.read_text(encoding="utf-8") for f in files), [f.name for f in files]


def dump(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main(argv=None) -> int:  # noqa: ANN001
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--out", default=str(B.REPO / "tests" / "data" / "fixtures"))
    ap.add_argument("--only", default="greedy,templates,sampler,perplexity")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    engine = B.LlamaCppEngine()
    text, text_files = texts_concatenated(B.REPO)
    templates, ppl = {}, {}
    for short, path in B.resolve_models(",".join([QWEN, GEMMA]), args.model_dir):
        rec = Recorder(engine, path)
        try:
            if "greedy" in only:
                dump(out / f"greedy_{short}.json", record_greedy(rec, short))
            if "templates" in only:
                templates[short] = record_templates(rec)
            if "sampler" in only and short == QWEN:
                dump(out / f"sampler_chain_{short}.json", record_sampler(rec))
            if "perplexity" in only:
                ppl[short] = record_perplexity(rec, text)
        finally:
            rec.close()
    if templates:
        dump(out / "chat_templates.json", {
            "recorded_with": LLAMA_CPP_BUILD, "messages": CONVERSATION, "add_generation_prompt": True,
            "renderers": {"llama_chat_apply_template": "libllama's built-in formats, chosen by matching the GGUF template",
                          "jinja2": "llama-cpp-python's Jinja2ChatFormatter running the GGUF template (trim_blocks, lstrip_blocks), bos_token/eos_token = the vocab's texts"},
            "models": templates})
    if ppl:
        dump(out / "perplexity.json", {
            "recorded_with": LLAMA_CPP_BUILD, "texts": text_files,
            "text_join": "file contents concatenated in name order, nothing in between",
            "method": "llama-perplexity -c 128 (default batch 2048 => 16 chunks per batch as sequences 0..15): "
                      "chunk i = tokens[i*128:(i+1)*128], first token replaced by BOS when the vocab adds BOS, "
                      "positions 64..126 score the next token: nll = -log softmax(logits)[next]; "
                      "ppl_running = exp(sum nll / count) as printed '[i]x.xxxx'",
            "models": ppl})
    return 0


if __name__ == "__main__":
    sys.exit(main())
