"""``ferrollama chat``: a conversation through the model's own chat template.

Each turn renders the whole conversation with the template, finds the longest prefix it shares
with what the cache holds and decodes only the rest (``kv.seq_rm`` drops what differs). When the
context fills, it shifts like llama-cli: the first --keep tokens stay, half of the rest is
dropped. Ctrl-C stops the current answer and returns to the prompt; Ctrl-D (end of input)
ends the conversation.

With ``--mmproj`` (the model's projector) messages take images, as llama-mtmd-cli's: ``--image``
for the first message (a media marker is put before it for each image it does not place), and
``/image PATH`` in the conversation for the next one. A conversation with images does not shift.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time

from .._core import Batch
from ..chat.templates import ChatTemplate
from ..generation.sampler import Sampler
from ..generation.text import StopScanner
from ..generation.media import MediaError
from ..generation.multimodal import (MEDIA_MARKER, EncodedImage, eval_image, image_key, key_runs, prompt_keys,
                                    whole_image_prefix)
from ..generation.tokens import add_bos_of, common_prefix_len
from ..loading import load_projector
from .common import (CLIError, add_context_args, add_mmproj_arg, add_model_args, add_sampling_args, int_value,
                     load_model, make_context, n_predict_value, print_timings, process_escapes, read_text_file,
                     sampling_params, warmup)
from .generate import drop_middle, read_input


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_mmproj_arg(p)
    add_context_args(p)
    add_sampling_args(p)
    g = p.add_argument_group("chat")
    g.add_argument("-sys", "--system-prompt", default="", metavar="PROMPT", help="the system message")
    g.add_argument("-p", "--prompt", default=None, help="the first user message")
    g.add_argument("-st", "--single-turn", action="store_true", help="answer -p and exit")
    g.add_argument("-n", "--n-predict", type=n_predict_value, default=-1, metavar="N",
                   help="most tokens per answer (default: -1, until the model ends it; -2: or the context is full)")
    g.add_argument("--keep", type=int_value, default=0, metavar="N",
                   help="tokens kept at the start when the context shifts (default: 0, BOS only; -1: the system prompt)")
    g.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="use this template instead of the model's: a built-in format (chatml, gemma) or a Jinja source")
    g.add_argument("--chat-template-file", default=None, metavar="FNAME", help="read the template from a file")
    g.add_argument("-mli", "--multiline-input", action="store_true", help="multi-line input: end it with '\\'")
    g.add_argument("--no-escape", dest="escape", action="store_false", default=True, help="do not process escapes")
    g.add_argument("--image", action="append", default=[], metavar="FNAME",
                   help="an image for the first message (-p), with --mmproj (repeat for several)")
    # llama-mtmd-cli's --audio: a media file like --image's, in the same list (the projector tells them apart)
    g.add_argument("--audio", action="append", dest="image", metavar="FNAME",
                   help="an audio file for the first message (-p), with an audio --mmproj (repeat for several)")


class Conversation:
    """The messages, the tokens the cache holds for them, and the context-shift bookkeeping."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t_start = time.perf_counter()
        self.model = load_model(args)
        self.ctx = make_context(args, self.model)
        self.perf_base = warmup(self.ctx, self.model) if not args.no_warmup else dict(self.ctx.perf)
        override = args.chat_template
        if args.chat_template_file:
            override = read_text_file(args.chat_template_file, "chat template file")
        self.template = ChatTemplate.from_model(self.model, override)
        self.projector = load_projector(args, self.model)
        #: the conversation's images in order (encoded once), and those of the message being written
        self.images: list[EncodedImage] = []
        self.next_images: list[EncodedImage] = []
        self.stop_tokens = self.template.stop_tokens(self.model)
        self.params = sampling_params(args, self.model)
        self.sampler = Sampler(self.model, self.params)
        self.messages: list[dict] = []
        if args.system_prompt:
            self.messages.append({"role": "system", "content": self._escape(args.system_prompt)})
        #: the conversation's tokens as if nothing had been dropped
        self.full: list[int] = []
        #: tokens dropped just after the first n_keep by context shifts
        self.dropped = 0
        self.n_keep = self._n_keep()
        self.generating = False
        self.interrupted = False
        #: media markers of the /image commands since the last message
        self.pending_text = ""

    def _escape(self, text: str) -> str:
        return process_escapes(text) if self.args.escape else text

    def _n_keep(self) -> int:
        keep = self.args.keep
        if keep >= 0:
            return keep + int(add_bos_of(self.model))
        system = self.template.tokens(self.model, self.messages, add_generation_prompt=False) if self.messages else []
        return len(system)

    @property
    def n_past(self) -> int:
        return len(self.full) - self.dropped

    # --- the cache ---
    def shift(self) -> None:
        if self.images:
            raise CLIError(f"the context ({self.ctx.n_ctx} tokens) is full, and a conversation with images does not "
                           "shift; use a larger -c")
        n_discard = (self.n_past - self.n_keep) // 2
        if n_discard <= 0:
            raise CLIError(f"the context ({self.ctx.n_ctx} tokens) is too small for --keep {self.n_keep}")
        kv = self.ctx.kv
        drop_middle(self.ctx, self.n_keep, self.n_keep + n_discard)
        kv.seq_add(0, self.n_keep + n_discard, self.n_past, -n_discard)
        self.dropped += n_discard

    def feed(self, tokens: list[int]) -> None:
        """Decodes tokens (and images: their keys) after the cached ones, shifting the context
        when it is full."""
        for start, end in key_runs(tokens):
            if tokens[start] < 0:
                self._feed_image(tokens[start:end])
            else:
                self._feed_tokens(tokens[start:end])

    def _feed_image(self, keys: list[int]) -> None:
        chunk = next(c for image in self.images for c in image.chunks if image_key(c) == keys[0])
        if self.n_past + len(keys) > self.ctx.n_ctx:
            self.shift()
        eval_image(self.ctx, chunk, self.n_past, 0, self.ctx.n_batch)
        self.full.extend(keys)

    def _feed_tokens(self, tokens: list[int]) -> None:
        room = max(1, min(self.ctx.n_batch, (self.ctx.n_ctx - self.n_keep) // 2))
        i = 0
        while i < len(tokens):
            chunk = tokens[i:i + room]
            while self.n_past + len(chunk) > self.ctx.n_ctx:
                self.shift()
            self.ctx.decode(Batch.from_tokens(chunk, pos0=self.n_past, seq_id=0, logits="last"))
            self.full.extend(chunk)
            i += len(chunk)

    def sync(self, tokens: list[int]) -> list[int]:
        """Makes the cache hold tokens; returns those that had to be decoded."""
        p = whole_image_prefix(tokens, min(common_prefix_len(self.full, tokens), len(tokens) - 1))
        if self.dropped and p < self.n_keep + self.dropped:
            self.ctx.kv.clear()
            self.full, self.dropped, p = [], 0, 0
        if not self.ctx.kv.seq_rm(0, p - self.dropped, -1):
            # a recurrent model's state cannot be cut back to the shared prefix: start over
            self.ctx.kv.clear()
            self.full, self.dropped, p = [], 0, 0
        del self.full[p:]
        new = tokens[p:]
        self.feed(new)
        return new

    # --- a turn ---
    def max_turn_tokens(self) -> int:
        """The most tokens one turn may add: what the context holds past the kept ones, less
        llama-cli's margin of 4."""
        return self.ctx.n_ctx - 4 - self.n_keep

    def answer(self, user_text: str, out) -> str:
        """Answers a message; a message too long for the context is refused (CLIError) and the
        conversation stays as it was."""
        prompt = self._prompt(self.messages + [{"role": "user", "content": user_text}])
        n_turn = len(prompt) - common_prefix_len(self.full, prompt)
        if n_turn > self.max_turn_tokens():
            raise CLIError(f"the message is too long ({n_turn} tokens with the template's, max "
                           f"{self.max_turn_tokens()} for a context of {self.ctx.n_ctx}); use a larger -c")
        self.messages.append({"role": "user", "content": user_text})
        self.images += self.next_images
        self.next_images = []
        self.generating, self.interrupted = True, False
        try:
            self.sampler.reset()
            for t in self.sync(prompt):
                if t >= 0:  # an image's positions are no tokens
                    self.sampler.accept(t, accept_grammar=False)
            text = self._generate(out)
        finally:
            self.generating = False
        self.messages.append({"role": "assistant", "content": text})
        return text

    def _prompt(self, messages: list[dict]) -> list[int]:
        """The conversation's tokens, an image's positions as its key (generation.multimodal)."""
        images = self.images + self.next_images
        if not images:
            return self.template.tokens(self.model, messages, add_generation_prompt=True)
        text = self.template.apply(messages, add_generation_prompt=True)
        try:
            return prompt_keys(self.projector.tokenize(text, images))[0]
        except ValueError as e:
            raise CLIError(str(e)) from None

    def add_image(self, path: str) -> None:
        """An image for the next message (its marker is the caller's to place)."""
        if self.projector is None:
            raise CLIError("images need the model's projector: --mmproj FILE")
        try:
            self.next_images.append(self.projector.encode_image(path))
        except (MediaError, OSError) as e:
            raise CLIError(f"{path}: {e}") from None

    def _generate(self, out) -> str:
        """Streams the answer until an end-of-generation token or a turn marker of the template
        (as a token or as text), -n tokens, the end of a context that may not shift, or Ctrl-C."""
        scanner, n = StopScanner(self.template.stop_strings()), 0
        limit = self.args.n_predict
        while (limit < 0 or n < limit) and not self.interrupted:
            token = self.sampler.sample(self.ctx, -1)
            self.sampler.accept(token)
            if self.model.is_eog(token) or token in self.stop_tokens:
                break
            text, stopped = scanner.push(self.model.token_to_piece(token, False))
            out.write(text)
            out.flush()
            if stopped:
                break
            n += 1
            if limit == -2 and self.n_past + 1 > self.ctx.n_ctx:
                break
            self.feed([token])
        out.write(scanner.flush())
        out.write("\n")
        out.flush()
        return scanner.text

    # --- the session ---
    def install_sigint(self) -> None:
        def handler(signum, frame):
            if self.generating:
                self.interrupted = True
                return
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, handler)

    def run(self) -> int:
        out = sys.stdout
        self.install_sigint()
        first = self._escape(self.args.prompt) if self.args.prompt else None
        status = 0
        try:
            for path in self.args.image:
                self.add_image(path)
            if first is not None:
                if self.args.image and MEDIA_MARKER not in first:
                    first = MEDIA_MARKER * len(self.args.image) + first  # llama-mtmd-cli's placement
                self.answer(first, out)
            # -p with --image is one turn, as in llama-mtmd-cli
            if not (self.args.single_turn or self.args.image) or first is None:
                self._interact(out)
        except KeyboardInterrupt:
            out.write("\n")
            status = 130
        out.flush()
        print_timings(self.ctx, self.perf_base, self.t_start, self.sampler.t_sample_ms, self.sampler.n_sample,
                      getattr(self.args, "t_load_ms", None))
        return status

    def _interact(self, out) -> None:
        while True:
            out.write("\n> ")
            out.flush()
            text = read_input(self.args.multiline_input)
            if text is None:
                out.write("\n")
                return
            text = text.rstrip("\n")
            if not text:
                continue
            try:
                command = next((c for c in ("/image ", "/audio ") if text.startswith(c)), None)
                if command is not None:
                    self.add_image(text[len(command):].strip())
                    self.pending_text += MEDIA_MARKER
                    print(f"{text[len(command):].strip()} {command[1:-1]} loaded", file=sys.stderr, flush=True)
                    continue
                self.answer(self.pending_text + self._escape(text), out)
                self.pending_text = ""
            except CLIError as e:
                print(f"error: {e}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.single_turn and args.prompt is None:
        raise CLIError("--single-turn needs the message in -p")
    if args.image and args.mmproj is None:
        raise CLIError("--image and --audio need the model's projector: --mmproj FILE")
    return Conversation(args).run()

