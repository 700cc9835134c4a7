"""``ferrollama generate --lookup N`` and ``-md DRAFT.gguf``: generation with speculative
decoding (llama.cpp's llama-lookup and llama-speculative): the prompt is printed, then the
text as the target model accepts it, drafts verified in one batch each; at the end the
timings and the draft acceptance go to stderr. Greedy or sampled, with every sampler flag."""
from __future__ import annotations

import argparse
import sys
import time

from .._core import Batch
from ..generation.speculative import DraftModel, PromptLookupDecoding, SpeculativeStats, speculative_tokens
from .common import CLIError, float_value, int_value, log, print_timings

#: generate's flags that the speculative loop does not run (each is llama-cli's main loop).
_MAIN_LOOP_ONLY = {"interactive": "-i", "interactive_first": "-if", "cfg_negative_prompt": "--cfg-negative-prompt",
                   "prompt_cache": "--prompt-cache", "keep": "--keep"}


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--lookup", type=int_value, default=0, metavar="N",
                   help="draft up to N tokens by prompt lookup (n-gram match in the prompt and output)")
    g.add_argument("--lookup-ngram", type=int_value, default=2, metavar="N",
                   help="longest n-gram prompt lookup matches (default: 2)")
    g.add_argument("-md", "--model-draft", metavar="FNAME", default=None, help="a draft model with the same vocabulary")
    g.add_argument("--draft-max", "--draft", "--draft-n", type=int_value, default=16, metavar="N",
                   help="tokens the draft model drafts at most (default: 16)")
    g.add_argument("--draft-min", type=int_value, default=0, metavar="N",
                   help="shortest draft worth verifying (default: 0)")
    g.add_argument("--draft-p-min", type=float_value, default=0.75, metavar="P",
                   help="the draft stops below this probability of its top token (default: 0.75)")


def wants_speculation(args: argparse.Namespace) -> bool:
    return bool(args.lookup) or args.model_draft is not None


def _check(args: argparse.Namespace) -> None:
    if args.lookup and args.model_draft:
        raise CLIError("give --lookup or -md, not both")
    if args.lookup < 0:
        raise CLIError(f"--lookup must be positive, not {args.lookup}")
    if args.lookup_ngram < 1:
        raise CLIError(f"--lookup-ngram must be at least 1, not {args.lookup_ngram}")
    for name, flag in _MAIN_LOOP_ONLY.items():
        if getattr(args, name, None):
            raise CLIError(f"{flag} does not combine with speculative decoding (--lookup, -md)")
    if args.grp_attn_n != 1:
        raise CLIError("-gan does not combine with speculative decoding (--lookup, -md)")


def _drafter(args: argparse.Namespace, gen) -> PromptLookupDecoding | DraftModel:  # noqa: ANN001
    if args.lookup:
        return PromptLookupDecoding(max_ngram_size=args.lookup_ngram, num_pred_tokens=args.lookup)
    try:
        draft = DraftModel(args.model_draft, draft_max=args.draft_max, draft_min=args.draft_min,
                           draft_p_min=args.draft_p_min, n_ctx=gen.n_ctx, n_threads=args.threads)
        draft.check_vocab(gen.model)
    except ValueError as e:
        raise CLIError(f"-md: {e}") from None
    return draft


def run_speculative(args: argparse.Namespace, gen) -> int:  # noqa: ANN001 - a generate.Generation
    """Prompt, then tokens until EOG, -n tokens, or a full context (no context shift)."""
    _check(args)
    drafter = _drafter(args, gen)
    tokens = gen.tokenize_prompt(gen.prompt_text(), [])
    if not args.no_display_prompt:
        gen.out.write(b"".join(gen.model.token_to_piece(t, args.special) for t in tokens))
    cached: list[int] = []
    for i in range(0, len(tokens), gen.n_batch):
        chunk = tokens[i:i + gen.n_batch]
        gen.ctx.decode(Batch.from_tokens(chunk, pos0=len(cached), logits="last"))
        cached.extend(chunk)
    for t in tokens:
        gen.sampler.accept(t, accept_grammar=False)

    def sample(row):  # noqa: ANN001, ANN202
        token = gen.sampler.sample_logits(row)
        gen.sampler.accept(token, accept_grammar=True)
        return token

    stats, n_out, status = SpeculativeStats(), 0, 0
    t0 = time.perf_counter()
    try:
        for token in speculative_tokens(gen.ctx, cached, gen.ctx.logits(-1), sample, drafter, gen.n_ctx, stats=stats):
            if gen.model.is_eog(token) and not args.ignore_eos:
                break
            gen.out.write(gen.model.token_to_piece(token, args.special))
            n_out += 1
            if 0 <= args.n_predict <= n_out:
                break
    except KeyboardInterrupt:
        status = 130
    finally:
        gen.out.close()
    elapsed = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    log(f"decoded {n_out} tokens in {elapsed:.3f} s, speed: {n_out / elapsed if elapsed > 0 else 0.0:.2f} t/s")
    log(f"n_draft   = {args.lookup or args.draft_max}")
    log(f"n_predict = {n_out}")
    log(f"n_drafted = {stats.n_drafted}")
    log(f"n_accept  = {stats.n_accepted}")
    log(f"accept    = {100.0 * stats.acceptance:.3f}%")
    print_timings(gen.ctx, gen.perf_base, gen.t_start, gen.sampler.t_sample_ms, gen.sampler.n_sample,
                  getattr(args, "t_load_ms", None))
    return status
