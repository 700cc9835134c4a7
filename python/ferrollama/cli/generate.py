"""``ferrollama generate``: llama.cpp's llama-cli (completion mode) loop.

The prompt is printed, then the text as it is generated; at the end, the timings go to stderr.
The loop is llama.cpp's: context shifting past --keep when the context fills, or Self-Extend
with -gan/-gaw; --prompt-cache reuses the longest matching prefix of a saved session;
-i/-r/--in-prefix/--in-suffix make it interactive; --cfg-negative-prompt runs a second context
for classifier-free guidance.
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import threading
import time

import numpy as np

from .._core import Batch, Context, StateError
from ..generation.sampler import Sampler
from ..generation.text import Utf8Stream
from ..generation.tokens import add_bos_of
from .common import (CLIError, add_context_args, add_model_args, add_sampling_args, float_value, int_value,
                     load_model, log, make_context, n_predict_value, print_timings, process_escapes, progress,
                     read_text_file, sampling_params, warmup)
from .control_vector import add_control_vector_args, apply_control_vectors
from .speculative import add_speculative_args, run_speculative, wants_speculation


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_context_args(p)
    add_sampling_args(p)
    g = p.add_argument_group("generation")
    g.add_argument("-p", "--prompt", default=None, help="the prompt")
    g.add_argument("-f", "--file", metavar="FNAME", default=None, help="a file holding the prompt")
    g.add_argument("-n", "--n-predict", type=n_predict_value, default=-1, metavar="N",
                   help="tokens to predict (default: -1, infinite: until the end of generation or a full context; "
                        "-2: until the context is full)")
    g.add_argument("--keep", type=int_value, default=None, metavar="N",
                   help="prompt tokens kept when the context shifts; turns context shift on (default: 0, -1 = all)")
    g.add_argument("--context-shift", dest="context_shift", action="store_true", default=None,
                   help="when the context is full, drop half of the tokens after --keep and go on "
                        "(default: off, as in llama.cpp, unless --keep is given)")
    g.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                   help="stop when the context is full (even with --keep)")
    g.add_argument("-gan", "--grp-attn-n", type=int_value, default=1, metavar="N", help="Self-Extend group factor (default: 1, off)")
    g.add_argument("-gaw", "--grp-attn-w", type=int_value, default=512, metavar="N", help="Self-Extend group width (default: 512)")
    g.add_argument("--prompt-cache", metavar="FNAME", default=None, help="a file to cache the prompt state in")
    g.add_argument("--prompt-cache-all", action="store_true", help="also save the generated tokens in the prompt cache")
    g.add_argument("--prompt-cache-ro", action="store_true", help="use the prompt cache without updating it")
    g.add_argument("-i", "--interactive", action="store_true", help="interactive mode")
    g.add_argument("-if", "--interactive-first", action="store_true", help="interactive mode, waiting for input first")
    g.add_argument("-mli", "--multiline-input", action="store_true", help="multi-line input: end it with '\\'")
    g.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="PROMPT",
                   help="halt generation at PROMPT and return control in interactive mode (repeatable)")
    g.add_argument("--in-prefix", default="", metavar="STRING", help="text added before each user input")
    g.add_argument("--in-suffix", default="", metavar="STRING", help="text added after each user input")
    g.add_argument("--in-prefix-bos", action="store_true", help="add BOS before each user input")
    g.add_argument("-e", "--escape", dest="escape", action="store_true", default=True,
                   help="process escapes (\\n, \\r, \\t, \\', \\\", \\\\) (default)")
    g.add_argument("--no-escape", dest="escape", action="store_false", help="do not process escapes")
    g.add_argument("--no-display-prompt", action="store_true", help="do not print the prompt")
    g.add_argument("-sp", "--special", action="store_true", help="print special tokens")
    g.add_argument("--cfg-negative-prompt", default="", metavar="PROMPT", help="negative prompt for classifier-free guidance")
    g.add_argument("--cfg-scale", type=float_value, default=1.0, metavar="N", help="strength of the guidance (default: 1.0, off)")
    add_control_vector_args(p)
    add_speculative_args(p)


class _Output:
    """Streams token pieces to stdout as whole UTF-8 characters."""

    def __init__(self) -> None:
        self.stream = Utf8Stream()

    def write(self, piece: bytes) -> None:
        text = self.stream.push(piece)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    def text(self, text: str) -> None:
        self.write(text.encode("utf-8"))

    def close(self) -> None:
        sys.stdout.write(self.stream.flush())
        sys.stdout.flush()


class _Guidance:
    """Classifier-free guidance: a second context fed the negative prompt instead of the prompt."""

    def __init__(self, args: argparse.Namespace, model, prompt: str):
        self.ctx = make_context(args, model)
        self.scale = args.cfg_scale
        negative = args.cfg_negative_prompt
        self.inp = list(model.tokenize(negative, add_special=True, parse_special=True))
        self.original_len = len(model.tokenize(prompt, add_special=True, parse_special=True))
        self.offset = len(self.inp) - self.original_len
        self.n_past = 0

    def decode(self, embd: list[int], n_batch: int) -> None:
        if self.n_past < len(self.inp):
            tokens = self.inp + embd[self.original_len:]
        else:
            tokens = embd
        for i in range(0, len(tokens), n_batch):
            chunk = tokens[i:i + n_batch]
            self.ctx.decode(Batch.from_tokens(chunk, pos0=self.n_past, seq_id=0, logits="last"))
            self.n_past += len(chunk)

    def shift(self, n_keep: int, n_discard: int) -> None:
        keep = max(1, n_keep + self.offset)
        drop_middle(self.ctx, keep, keep + n_discard)
        self.ctx.kv.seq_add(0, keep + n_discard, self.n_past, -n_discard)
        self.n_past -= n_discard

    def mix(self, logits: np.ndarray) -> np.ndarray:
        """llama.cpp's classifier-free guidance: scale * (log_softmax(l) - log_softmax(g)) + log_softmax(g)."""
        from .. import samplers

        return samplers.apply_guidance(logits, self.ctx.logits(-1), self.scale)


class Generation:
    """The state of llama-cli's main loop."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t_start = time.perf_counter()
        self.model = load_model(args)
        self.ctx: Context = make_context(args, self.model)
        if self.context_shift() and not self.ctx.kv.can_shift:
            # common_init_from_params: the cache cannot move positions (M-RoPE keys)
            log("KV cache shifting is not supported for this context, disabling KV cache shifting")
            args.context_shift = False
        apply_control_vectors(args, self.model, self.ctx)
        self.perf_base = warmup(self.ctx, self.model) if not args.no_warmup else dict(self.ctx.perf)
        self.n_ctx = self.ctx.n_ctx
        self.n_batch = self.ctx.n_batch
        self.add_bos = add_bos_of(self.model)
        self.sampler = Sampler(self.model, sampling_params(args, self.model))
        self.out = _Output()
        self.interactive = args.interactive or args.interactive_first
        self.is_interacting = False

    # --- setup ---
    def prompt_text(self) -> str:
        a = self.args
        if a.prompt is not None and a.file is not None:
            raise CLIError("give -p or -f, not both")
        text = read_text_file(a.file, "prompt file") if a.file is not None else (a.prompt or "")
        if a.escape:
            text = process_escapes(text)
            a.in_prefix, a.in_suffix = process_escapes(a.in_prefix), process_escapes(a.in_suffix)
            a.reverse_prompt = [process_escapes(r) for r in a.reverse_prompt]
        return text

    def load_session(self) -> list[int]:
        path = self.args.prompt_cache
        if not path or not os.path.exists(path) or os.path.getsize(path) == 0:
            return []
        try:
            tokens = list(self.ctx.state_load(path))
        except (StateError, ValueError) as e:
            raise CLIError(f"{path}: failed to load the prompt cache: {e}") from None
        if self.args.verbose:
            log(f"loaded a session with prompt size of {len(tokens)} tokens")
        return tokens

    def tokenize_prompt(self, prompt: str, session: list[int]) -> list[int]:
        if self.args.interactive_first or prompt or not session:
            tokens = list(self.model.tokenize(prompt, add_special=True, parse_special=True))
        else:
            tokens = list(session)
        if not tokens:
            if not self.add_bos:
                raise CLIError("the prompt is empty")
            tokens = [self.model.bos]
        if len(tokens) > self.n_ctx - 4:
            raise CLIError(f"the prompt is too long ({len(tokens)} tokens, max {self.n_ctx - 4})")
        return tokens

    def match_session(self, session: list[int], embd_inp: list[int]) -> int:
        """Keeps the cached prefix the prompt shares with the session; returns its length."""
        n = 0
        for a, b in zip(session, embd_inp):
            if a != b:
                break
            n += 1
        if session:
            if self.args.verbose:
                log(f"session file matches {n} / {len(embd_inp)} tokens of prompt")
            if not self.ctx.kv.seq_rm(-1, n, -1):
                # a recurrent model's state cannot be cut back to the shared prefix
                self.ctx.kv.clear()
                del session[:]
                return 0
        if embd_inp and n == len(embd_inp) and len(session) > len(embd_inp):
            del session[len(embd_inp) - 1:]  # re-evaluate the last token to get its logits
        return n

    def check_self_extend(self) -> None:
        n, w = self.args.grp_attn_n, self.args.grp_attn_w
        if n != 1 and (n <= 0 or w <= 0 or w % n != 0):
            raise CLIError(f"--grp-attn-w ({w}) must be a positive multiple of --grp-attn-n ({n})")
        if n != 1 and not self.ctx.kv.can_shift:
            raise CLIError(f"Self-Extend moves cached positions, which the '{self.model.arch}' model's cache cannot "
                           "(keys with M-RoPE)")

    # --- the loop ---
    def run(self) -> int:
        a = self.args
        self.check_self_extend()
        prompt = self.prompt_text()
        session = self.load_session()
        embd_inp = self.tokenize_prompt(prompt, session)
        n_matching = self.match_session(session, embd_inp)
        keep = 0 if a.keep is None else a.keep
        n_keep = len(embd_inp) if keep < 0 or keep > len(embd_inp) else keep + int(self.add_bos)
        guidance = _Guidance(a, self.model, prompt) if a.cfg_negative_prompt and a.cfg_scale != 1.0 else None
        antiprompt_tokens = [ids[0] for ids in (self.model.tokenize(r, add_special=False, parse_special=True)
                                                 for r in a.reverse_prompt) if len(ids) == 1]
        self.is_interacting = a.interactive_first
        self.install_sigint()
        state = _LoopState(embd_inp, session, n_keep, a.n_predict,
                           need_to_save=bool(a.prompt_cache) and n_matching < len(embd_inp))
        state.path_session = bool(a.prompt_cache)
        bar = progress(len(embd_inp), "prompt") if len(embd_inp) > self.n_batch else None
        state.display = not a.no_display_prompt
        status = 0
        try:
            self.loop(state, guidance, antiprompt_tokens, bar)
        except KeyboardInterrupt:
            status = 130
        finally:
            if bar is not None:
                bar.close()
            self.out.close()
        if status == 0 and a.prompt_cache and a.prompt_cache_all and not a.prompt_cache_ro and state.path_session:
            self.ctx.state_save(a.prompt_cache, state.session)
        sys.stdout.write("\n")
        sys.stdout.flush()
        print_timings(self.ctx, self.perf_base, self.t_start, self.sampler.t_sample_ms, self.sampler.n_sample,
                      getattr(a, "t_load_ms", None))
        return status

    def loop(self, st: "_LoopState", guidance: _Guidance | None, antiprompt_tokens: list[int], bar) -> None:
        a = self.args
        while (st.n_remain != 0 and not st.is_antiprompt) or self.interactive:
            if st.embd:
                if not self.make_room(st, guidance):
                    break
                self.reuse_session(st)
                self.decode(st, guidance, bar)
            st.embd = []
            if len(st.embd_inp) <= st.n_consumed and not self.is_interacting:
                if bar is not None:
                    bar.close()
                    bar = None
                    self.flush_pending(st)
                self.maybe_save_session(st)
                self.sample(st, guidance)
            else:
                self.consume_input(st)
            self.display(st, bar is not None)
            if len(st.embd_inp) <= st.n_consumed:
                if not self.after_output(st, antiprompt_tokens):
                    return
            if st.embd and self.model.is_eog(st.embd[-1]) and not self.interactive:
                self.out.text(" [end of text]\n")
                break
            if self.interactive and st.n_remain <= 0 and a.n_predict >= 0:
                st.n_remain = a.n_predict
                self.is_interacting = True

    def make_room(self, st: "_LoopState", guidance: _Guidance | None) -> bool:
        """Context shift (or Self-Extend) before decoding st.embd; False to stop."""
        a = self.args
        max_embd = self.n_ctx - 4
        if len(st.embd) > max_embd:
            log(f"<<input too long: skipped {len(st.embd) - max_embd} tokens>>")
            del st.embd[max_embd:]
        if a.grp_attn_n != 1:
            self.self_extend(st)
            return True
        if st.n_past + len(st.embd) < self.n_ctx:
            return True
        if not self.context_shift():
            log("\ncontext full and context shift is off, stopping (--context-shift or --keep N to go on)")
            return False
        if a.n_predict == -2:
            log("\ncontext full and -n is -2, stopping")
            return False
        n_discard = (st.n_past - st.n_keep) // 2
        kv = self.ctx.kv
        drop_middle(self.ctx, st.n_keep, st.n_keep + n_discard)
        kv.seq_add(0, st.n_keep + n_discard, st.n_past, -n_discard)
        st.n_past -= n_discard
        if guidance is not None:
            guidance.shift(st.n_keep, n_discard)
        st.path_session = False  # the cache no longer matches a prefix of the tokens
        return True

    def context_shift(self) -> bool:
        """Whether a full context shifts: --context-shift, or --keep (which only means something
        with a shift) unless --no-context-shift; off by default, as in llama.cpp."""
        a = self.args
        return a.context_shift if a.context_shift is not None else a.keep is not None

    def self_extend(self, st: "_LoopState") -> None:
        """llama-cli's Self-Extend: group positions past each window of ga_w."""
        ga_n, ga_w, kv = self.args.grp_attn_n, self.args.grp_attn_w, self.ctx.kv
        while st.n_past >= st.ga_i + ga_w:
            ib = (ga_n * st.ga_i) // ga_w
            bd = (ga_w // ga_n) * (ga_n - 1)
            dd = (ga_w // ga_n) - ib * bd - ga_w
            kv.seq_add(0, st.ga_i, st.n_past, ib * bd)
            kv.seq_div(0, st.ga_i + ib * bd, st.ga_i + ib * bd + ga_w, ga_n)
            kv.seq_add(0, st.ga_i + ib * bd + ga_w, st.n_past + ib * bd, dd)
            st.n_past -= bd
            st.ga_i += ga_w // ga_n

    def reuse_session(self, st: "_LoopState") -> None:
        """Skips the tokens of st.embd that the loaded session already holds."""
        if st.n_session_consumed >= len(st.session):
            return
        i = 0
        while i < len(st.embd):
            if st.embd[i] != st.session[st.n_session_consumed]:
                del st.session[st.n_session_consumed:]
                break
            st.n_past += 1
            st.n_session_consumed += 1
            if st.n_session_consumed >= len(st.session):
                i += 1
                break
            i += 1
        del st.embd[:i]

    def decode(self, st: "_LoopState", guidance: _Guidance | None, bar) -> None:
        if guidance is not None:
            guidance.decode(st.embd, self.n_batch)
        for i in range(0, len(st.embd), self.n_batch):
            chunk = st.embd[i:i + self.n_batch]
            self.ctx.decode(Batch.from_tokens(chunk, pos0=st.n_past, seq_id=0, logits="last"))
            st.n_past += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        if st.embd and st.path_session:
            st.session.extend(st.embd)
            st.n_session_consumed = len(st.session)

    def maybe_save_session(self, st: "_LoopState") -> None:
        a = self.args
        if a.prompt_cache and st.path_session and st.need_to_save and not a.prompt_cache_ro:
            st.need_to_save = False
            self.ctx.state_save(a.prompt_cache, st.session)

    def sample(self, st: "_LoopState", guidance: _Guidance | None) -> None:
        logits = self.ctx.logits(-1)
        if guidance is not None:
            logits = guidance.mix(logits)
        token = self.sampler.sample_logits(logits)
        self.sampler.accept(token, accept_grammar=True)
        st.embd.append(token)
        st.input_echo = True
        st.n_remain -= 1

    def consume_input(self, st: "_LoopState") -> None:
        while len(st.embd_inp) > st.n_consumed:
            token = st.embd_inp[st.n_consumed]
            st.embd.append(token)
            self.sampler.accept(token, accept_grammar=False)
            st.n_consumed += 1
            if len(st.embd) >= self.n_batch:
                break

    def display(self, st: "_LoopState", defer: bool) -> None:
        if st.input_echo and st.display:
            if defer:
                st.pending_echo.extend(st.embd)
            else:
                for token in st.embd:
                    self.out.write(self.model.token_to_piece(token, self.args.special))
        if st.input_echo and len(st.embd_inp) == st.n_consumed:
            st.display = True

    def flush_pending(self, st: "_LoopState") -> None:
        for token in st.pending_echo:
            self.out.write(self.model.token_to_piece(token, self.args.special))
        st.pending_echo = []

    def after_output(self, st: "_LoopState", antiprompt_tokens: list[int]) -> bool:
        """Reverse prompts, end of generation and user input; False when the user ends the session."""
        a = self.args
        if a.reverse_prompt:
            self.check_antiprompt(st, antiprompt_tokens)
        last = self.sampler.prev[-1] if self.sampler.prev else None
        if last is not None and self.model.is_eog(last) and self.interactive:
            if a.reverse_prompt:
                st.embd_inp.extend(self.model.tokenize(a.reverse_prompt[0], add_special=False, parse_special=True))
                st.is_antiprompt = True
            self.is_interacting = True
            self.out.text("\n")
        if st.n_past > 0 and self.is_interacting:
            if not self.read_user_input(st):
                return False
            st.input_echo = False
        if st.n_past > 0:
            if self.is_interacting:
                self.sampler.reset()
            self.is_interacting = False
        return True

    def check_antiprompt(self, st: "_LoopState", antiprompt_tokens: list[int]) -> None:
        last_output = self.sampler.prev_text(32)
        st.is_antiprompt = False
        pad = 0 if self.interactive else 2
        for rp in self.args.reverse_prompt:
            if rp in last_output[max(0, len(last_output) - len(rp) - pad):]:
                st.is_antiprompt = True
                break
        if last_output and self.sampler.prev and self.sampler.prev[-1] in antiprompt_tokens:
            st.is_antiprompt = True
        if st.is_antiprompt and self.interactive:
            self.is_interacting = True

    def read_user_input(self, st: "_LoopState") -> bool:
        a = self.args
        self.out.close()
        if a.in_prefix_bos and self.model.bos is not None:
            st.embd_inp.append(self.model.bos)
        if a.in_prefix:
            self.out.text(a.in_prefix)
            self.out.close()
        buffer = read_input(a.multiline_input)
        if buffer is None or buffer == "":
            log("EOF by user")
            return False
        if buffer.endswith("\n"):
            buffer = buffer[:-1]
        if buffer:
            if a.in_suffix:
                self.out.text(a.in_suffix)
            if a.escape:
                buffer = process_escapes(buffer)
            tok = lambda s, special: list(self.model.tokenize(s, add_special=False, parse_special=special))  # noqa: E731
            line = tok(buffer, False)
            st.embd_inp.extend(tok(a.in_prefix, True) + line + tok(a.in_suffix, True))
            st.n_remain -= len(line)
        return True

    def install_sigint(self) -> None:
        """Ctrl-C: in interactive mode, return control to the user; otherwise, or twice, quit."""
        def handler(signum, frame):
            if self.interactive and not self.is_interacting:
                self.is_interacting = True
                return
            raise KeyboardInterrupt
        if sys.stdin is not None:
            signal.signal(signal.SIGINT, handler)


class _LoopState:
    def __init__(self, embd_inp: list[int], session: list[int], n_keep: int, n_predict: int, need_to_save: bool):
        self.embd_inp = embd_inp
        self.session = session
        self.n_keep = n_keep
        self.n_remain = n_predict
        self.need_to_save = need_to_save
        self.path_session = True
        self.embd: list[int] = []
        self.pending_echo: list[int] = []
        self.n_past = 0
        self.n_consumed = 0
        self.n_session_consumed = 0
        self.ga_i = 0
        self.is_antiprompt = False
        self.input_echo = True
        self.display = True


def wait_for_terminal_line(stream) -> None:
    """On a terminal, returns once a line can be read, waiting in select() on the terminal and
    on a pipe that a signal's arrival writes to (``signal.set_wakeup_fd``). Reading at once,
    a Ctrl-C that came between the prompt and the read() call left the read waiting for the
    next line: the signal's Python handler runs only when the read returns (measured: 2 in
    30 chats through a pseudo-terminal ignored the Ctrl-C at the prompt)."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread() or not stream.isatty():
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    previous = signal.set_wakeup_fd(wake_w)
    try:
        while True:
            ready, _, _ = select.select([stream, wake_r], [], [])
            if stream in ready:
                return
            # A signal arrived: its handler runs here (Ctrl-C at the prompt raises
            # KeyboardInterrupt); one that returns leaves the wait going on.
            os.read(wake_r, 512)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_r)
        os.close(wake_w)


def read_input(multiline: bool) -> str | None:
    """A user input as llama.cpp's console reads it: a line ending in '\\' continues (the other way
    round with -mli), one ending in '/' returns control without a newline. None at end of input."""
    buffer = ""
    while True:
        wait_for_terminal_line(sys.stdin)
        line = sys.stdin.readline()
        if line == "":
            return buffer or None
        line = line.rstrip("\r\n")
        more = multiline
        if line.endswith("/"):
            return buffer + line[:-1]
        if line.endswith("\\"):
            line, more = line[:-1], not multiline
        buffer += line + "\n"
        if not more:
            return buffer


def run(args: argparse.Namespace) -> int:
    gen = Generation(args)
    if wants_speculation(args):
        return run_speculative(args, gen)
    return gen.run()


def drop_middle(ctx: Context, p0: int, p1: int) -> None:
    """The context shift's removal of positions p0..p1 of sequence 0, or a CLIError where the
    model cannot (a recurrent state holds all of its past: nothing can leave its middle)."""
    if not ctx.kv.seq_rm(0, p0, p1):
        raise CLIError(f"the context is full and a context shift would drop tokens {p0}..{p1 - 1}, which the "
                       f"recurrent model '{ctx.model.arch}' cannot do: use a larger context (-c)")
