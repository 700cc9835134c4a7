"""Continuous batching over one Context: slots, prompt chunks, prefix reuse (llama-server's loop).

A :class:`Scheduler` owns one ``Context`` with ``n_seq`` sequences, one per slot. Each decode
step puts one token of every generating slot and chunks of the prompts still being read into a
single batch, so a new prompt never stops the running streams. A slot keeps the tokens its
sequence holds in the cache: the next prompt reuses their longest common prefix (``seq_rm`` of
the rest), and a prompt that shares a longer prefix with another slot copies those cells
(``seq_cp``) instead of decoding them again.

The decode loop runs in a worker thread (the engine releases the GIL while it decodes); jobs are
iterated from threads (``for out in job``) or coroutines (``async for out in job``)::

    sched = Scheduler(model, n_ctx=4096, n_seq=4)
    job = sched.submit(Request(tokens=model.tokenize("Hello"), max_tokens=16))
    print("".join(out.text for out in job))
    sched.close()
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Sequence

from .._core import Batch, Context, DecodeError, Model
from .checkpoints import DEFAULT_CHECKPOINTS, Checkpoints
from .logprobs import TokenLogprob, token_logprob
from .logprobs import chat_logprobs as _chat_logprobs
from .logprobs import completion_logprobs as _completion_logprobs
from .multimodal import eval_image, key_runs, whole_image_prefix
from .params import SamplingParams
from .sampler import Sampler
from .speculative import predicted_draft, snapshots_for
from .text import StopScanner
from .tokens import common_prefix_len

__all__ = ["Request", "Output", "Job", "Scheduler", "QueueFull", "JobFailed", "completion_logprobs", "chat_logprobs",
           "TokenLogprob"]

log = logging.getLogger("ferrollama.server")


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full: try again later."""


class JobFailed(Exception):
    """The engine failed on this job (the others go on)."""


@dataclass
class Request:
    """One generation: prompt tokens, sampling and when to stop."""

    tokens: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    #: at most this many tokens (None: until the slot's context is full)
    max_tokens: int | None = 16
    stop: Sequence[str] = ()
    #: how many most likely tokens to report with each token's log-probability (None: none)
    top_logprobs: int | None = None
    #: reuse cached prefixes (llama.cpp's cache_prompt)
    cache_prompt: bool = True
    #: render special tokens in the text (for chat formats whose tool calls are special tokens)
    special: bool = False
    #: tokens the answer is expected to repeat (OpenAI's predicted output): drafted from first,
    #: where the scheduler drafts
    prediction: Sequence[int] = ()
    #: the images of a prompt with images (generation.multimodal.prompt_keys): ``tokens`` holds
    #: each one's key at its positions
    media: dict = field(default_factory=dict)


@dataclass
class Output:
    """What a job yields per sampled token: the text now safe to emit and, last, why it ended."""

    text: str
    token: int | None = None
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None
    #: with the last output: prompt_tokens, completion_tokens, cached_tokens
    usage: dict[str, int] | None = None


class Job:
    """A submitted request: iterate it (threads) or async-iterate it (coroutines) for Outputs."""

    def __init__(self, request: Request, sampler: Sampler):
        self.request = request
        self._sampler = sampler
        self._events: collections.deque[Output | BaseException] = collections.deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.cancelled = False
        self.finished = False

    # --- the worker's side ---
    def _push(self, event: Output | BaseException) -> None:
        with self._cond:
            self._events.append(event)
            if isinstance(event, BaseException) or event.finish_reason is not None:
                self.finished = True
            self._cond.notify_all()
            waiters = list(self._waiters)
        for loop, ev in waiters:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    # --- the consumer's side ---
    def cancel(self) -> None:
        """Frees the job's slot at the next step (a client that went away)."""
        self.cancelled = True

    def __iter__(self) -> Iterator[Output]:
        while True:
            with self._cond:
                while not self._events:
                    self._cond.wait()
                event = self._events.popleft()
            yield from self._unwrap(event)
            if isinstance(event, Output) and event.finish_reason is not None:
                return

    async def __aiter__(self) -> AsyncIterator[Output]:
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        with self._cond:
            self._waiters.append((loop, ready))
        try:
            while True:
                with self._cond:
                    event = self._events.popleft() if self._events else None
                    if event is None:
                        ready.clear()
                if event is None:
                    await ready.wait()
                    continue
                for out in self._unwrap(event):
                    yield out
                if event.finish_reason is not None:  # type: ignore[union-attr]
                    return
        finally:
            with self._cond:
                self._waiters.remove((loop, ready))

    @staticmethod
    def _unwrap(event: Output | BaseException) -> Iterator[Output]:
        if isinstance(event, BaseException):
            raise event
        yield event

    def result(self) -> tuple[str, list[Output]]:
        """Blocks until done; (the whole text, every output)."""
        outs = list(self)
        return "".join(o.text for o in outs), outs


IDLE, WAITING, PROMPT, GENERATING = "idle", "waiting", "prompt", "generating"


class Slot:
    """One sequence of the context and the job it serves."""

    def __init__(self, seq_id: int):
        self.seq_id = seq_id
        self.state = IDLE
        #: tokens whose keys and values are in the cache for this sequence (positions 0..n-1)
        self.tokens: list[int] = []
        self.job: Job | None = None
        #: prompt tokens still to decode
        self.pending: list[int] = []
        #: the sampled token not yet decoded
        self.next_token: int | None = None
        #: WAITING: (source slot, its job, prefix length) to copy once the source has decoded it
        self.copy_from: tuple[Slot, Job | None, int] | None = None
        self.sampler: Sampler | None = None
        self.scanner: StopScanner | None = None
        self.n_prompt = self.n_cached = self.n_generated = 0
        #: the batch row whose logits this slot samples from after the step (-1: none)
        self.i_batch = -1
        #: prompt tokens this step's batch holds
        self.n_in_batch = 0
        #: tokens drafted after next_token in this step's batch (speculative decoding)
        self.draft: list[int] = []
        self.last_used = 0.0

    @property
    def busy(self) -> bool:
        return self.state != IDLE

    def release(self) -> None:
        self.state, self.job, self.sampler, self.scanner = IDLE, None, None, None
        self.pending, self.next_token, self.copy_from, self.i_batch, self.draft = [], None, None, -1, []
        self.last_used = time.monotonic()


@dataclass
class Stats:
    """Counters since start (read by /metrics)."""

    requests_done: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0
    #: prompt tokens decoded (the rest were reused in place or copied)
    prompt_tokens_decoded: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_copied: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    #: speculative decoding: tokens drafted, and those the model sampled too
    drafted_tokens: int = 0
    accepted_tokens: int = 0


class Scheduler:
    """Slots and continuous batching over one Context (see the module's docstring).

    ``n_ctx`` is the whole cache; each slot holds at most ``n_ctx // n_seq`` tokens, as in
    llama-server. ``n_batch`` bounds the tokens of one decode step (prompt chunks fill what the
    generating slots leave). ``queue_size`` bounds the jobs waiting for a slot.

    ``drafter`` (ferrollama.PromptLookupDecoding, or a DraftModel with a sequence per slot)
    drafts tokens after each generating slot's next token from that slot's own tokens; the step decodes them with it and each slot
    keeps the drafted tokens its own sampler picks too (speculative decoding, per slot). A
    request's ``prediction`` is drafted from first (generation.speculative.predicted_draft).

    A recurrent model's slot cannot cut its state back to a shorter prefix: it keeps up to
    ``ctx_checkpoints`` checkpoints of its state (one before the last token of each prompt) and
    resumes from the longest within the prefix to reuse; a draft is dropped by rolling back to
    the states the context kept of the verifying decode (``n_rs_seq``).
    """

    def __init__(self, model: Model, n_ctx: int = 4096, n_seq: int = 4, n_batch: int = 512,
                 n_threads: int | None = None, queue_size: int = 64, type_k: str = "f16", type_v: str = "f16",
                 n_ubatch: int | None = None, n_threads_batch: int | None = None, drafter: Any = None,
                 loras: Sequence = (), ctx_checkpoints: int = DEFAULT_CHECKPOINTS, batch_invariant: bool = False):
        if n_seq < 1 or n_ctx < n_seq:
            raise ValueError(f"need 1 <= n_seq <= n_ctx, got n_seq={n_seq}, n_ctx={n_ctx}")
        self.model = model
        # swa_full: a slot may roll back into the sliding window to reuse a prefix (Gemma 3)
        ub = max(n_ubatch or n_batch, n_seq)
        rollback = snapshots_for(drafter, ub) if drafter is not None and model.is_recurrent else 0
        self.ctx = Context(model, n_ctx=n_ctx, n_batch=max(n_batch, n_seq), n_ubatch=ub,
                           n_seq_max=n_seq, n_threads=n_threads, n_threads_batch=n_threads_batch or n_threads,
                           type_k=type_k, type_v=type_v, swa_full=True, n_rs_seq=rollback,
                           batch_invariant=batch_invariant)
        self.checkpoints = Checkpoints(self.ctx, ctx_checkpoints)
        # (LoraAdapter, scale) pairs set on every context serving the model (--lora)
        self.loras = list(loras)
        for adapter, scale in self.loras:
            self.ctx.set_lora(adapter, scale)
        self.n_ctx_slot = n_ctx // n_seq
        # read once: the worker thread holds the context while it decodes, and submit's checks run elsewhere
        self.n_ubatch = self.ctx.n_ubatch
        self.n_batch = max(n_batch, n_seq)
        self.queue_size = queue_size
        self.slots = [Slot(i) for i in range(n_seq)]
        self.stats = Stats()
        self._queue: collections.deque[Job] = collections.deque()
        self._lock = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._batch = Batch(n_tokens_max=self.n_batch, n_seq_max=1)
        if drafter is not None and not hasattr(drafter, "draft"):
            raise ValueError("drafter must have a draft(tokens, n_max, seq_id) method "
                             "(ferrollama.PromptLookupDecoding or DraftModel)")
        if getattr(drafter, "n_seq", n_seq) < n_seq:
            raise ValueError(f"the draft model follows {drafter.n_seq} sequences; the scheduler has {n_seq} slots")
        self.drafter = drafter

    # --- public ---
    @property
    def n_seq(self) -> int:
        return len(self.slots)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def slots_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    def check(self, request: Request) -> None:
        """ValueError for a request no slot can serve (raised by submit too)."""
        n = len(request.tokens)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.n_ctx_slot:
            raise ValueError(f"the prompt has {n} tokens; a slot's context holds {self.n_ctx_slot} "
                             f"(prompt and answer)")
        if request.max_tokens is not None and request.max_tokens < 0:
            raise ValueError(f"max_tokens must be at least 0, not {request.max_tokens}")
        bad = [t for t in request.tokens if not 0 <= t < self.model.n_vocab and t not in request.media]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the vocabulary (0..{self.model.n_vocab - 1})")
        if request.media:
            self._check_media(request)

    def _check_media(self, request: Request) -> None:
        """A prompt's images: whole (each key's run its image's length), followed by text, and
        within one micro-batch where they are decoded non-causally."""
        keys = request.tokens
        if keys[-1] < 0:
            raise ValueError("the prompt must end with text after its last image")
        for start, end in key_runs(keys):
            chunk = request.media.get(keys[start]) if keys[start] < 0 else None
            if keys[start] < 0 and (chunk is None or chunk.n_pos != end - start):
                raise ValueError("an image's positions must hold its key, once per position")
            if chunk is not None and chunk.non_causal and chunk.n_tokens > self.n_ubatch:
                raise ValueError(f"an image of {chunk.n_tokens} tokens is decoded in one micro-batch: "
                                 f"--ubatch-size is {self.n_ubatch}")

    def submit(self, request: Request, sampler: Sampler | None = None) -> Job:
        """Queues a request; QueueFull when the queue is full, ValueError when it cannot be served."""
        return self.submit_many([request], [sampler])[0]

    def submit_many(self, requests: Sequence[Request], samplers: Sequence[Sampler | None] | None = None) -> list[Job]:
        """Queues several requests at once, or none of them (QueueFull)."""
        for r in requests:
            self.check(r)
        given = samplers or [None] * len(requests)
        jobs = [Job(r, s or Sampler(self.model, r.params)) for r, s in zip(requests, given)]
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            free = sum(not s.busy for s in self.slots)
            if len(self._queue) + len(jobs) > self.queue_size + free:
                raise QueueFull(f"{len(self._queue)} requests are waiting; the queue holds {self.queue_size}")
            self._queue.extend(jobs)
            self._start()
            self._lock.notify()
        return jobs

    def close(self) -> None:
        """Stops the worker; jobs still running fail."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the worker ---
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ferrollama-scheduler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._queue and not any(s.busy for s in self.slots):
                    self._lock.wait()
                if self._closed:
                    break
            try:
                self.step()
            except Exception as e:  # a bug must not stop the loop that serves everybody else
                log.exception("scheduler step failed; the running jobs fail")
                self._fail_all(JobFailed(f"internal error: {type(e).__name__}: {e}"), keep_queue=True)
        self._fail_all(RuntimeError("the server is shutting down"))

    def step(self) -> None:
        """One decode step: admit waiting jobs, decode one batch, sample, emit."""
        self._drop_cancelled()
        self._admit()
        self._resolve_copies()
        self._decode_image()
        rows = self._fill_batch()
        if not rows:
            return
        t0 = time.perf_counter()
        if not self._decode(rows):
            return
        self.stats.decode_steps += 1
        self.stats.decode_seconds += time.perf_counter() - t0
        for slot in rows:
            self._advance(slot)

    # admission
    def _drop_cancelled(self) -> None:
        with self._lock:
            gone = [j for j in self._queue if j.cancelled]
            for j in gone:
                self._queue.remove(j)
        for job in gone:
            self._finish_cancelled(job)
        for slot in self.slots:
            if slot.busy and slot.job is not None and slot.job.cancelled:
                self._finish_cancelled(slot.job)
                self._free(slot)

    def _finish_cancelled(self, job: Job) -> None:
        self.stats.requests_cancelled += 1
        job._push(Output("", finish_reason="cancelled"))

    def _admit(self) -> None:
        # under the lock: a job is always either queued or in a busy slot for submit's count
        with self._lock:
            while self._queue:
                free = [s for s in self.slots if not s.busy]
                if not free:
                    return
                self._assign(self._queue.popleft(), free)

    def _assign(self, job: Job, free: list[Slot]) -> None:
        """Puts a job in the idle slot whose cache shares most with its prompt (else the least
        recently used), reusing that prefix; a longer prefix of another slot is copied."""
        prompt = job.request.tokens
        use_cache = job.request.cache_prompt
        slot = max(free, key=lambda s: (common_prefix_len(s.tokens, prompt) if use_cache else 0, -s.last_used))
        keep = whole_image_prefix(prompt, min(common_prefix_len(slot.tokens, prompt), len(prompt) - 1)) if use_cache else 0
        slot.job, slot.sampler = job, job._sampler
        slot.scanner = StopScanner(list(job.request.stop))
        slot.n_prompt, slot.n_generated = len(prompt), 0
        keep = self._truncate(slot, keep)
        slot.n_cached = keep
        self.stats.prompt_tokens += len(prompt)
        self.stats.prompt_tokens_reused += keep
        source, shared = self._best_source(slot, prompt) if use_cache else (None, 0)
        if source is not None and shared > keep:
            slot.state, slot.copy_from = WAITING, (source, source.job, shared)
        else:
            slot.state = PROMPT
        slot.pending = prompt[len(slot.tokens):]
        for t in prompt:
            if t >= 0:  # an image's positions are no tokens
                slot.sampler.accept(t, accept_grammar=False)

    def _truncate(self, slot: Slot, keep: int) -> int:
        """Keeps at most the first `keep` tokens of the slot's cache (fewer where only a
        checkpoint of a recurrent state, or nothing, can be resumed); returns how many."""
        keep = self.checkpoints.rewind(slot.seq_id, min(keep, len(slot.tokens)))
        del slot.tokens[keep:]
        return keep

    def _best_source(self, slot: Slot, prompt: list[int]) -> tuple[Slot | None, int]:
        """The other slot whose cached or pending prompt shares the longest prefix with prompt."""
        best, best_n = None, 0
        for other in self.slots:
            if other is slot or other.state == WAITING:
                continue
            known = other.tokens + (other.pending if other.state == PROMPT else [])
            n = whole_image_prefix(prompt, min(common_prefix_len(known, prompt), len(prompt) - 1))
            if n > best_n:
                best, best_n = other, n
        return best, best_n

    def _resolve_copies(self) -> None:
        """A WAITING slot copies its prefix once the source has it in the cache (or gives up)."""
        for slot in self.slots:
            if slot.state != WAITING or slot.copy_from is None:
                continue
            source, source_job, n = slot.copy_from
            prompt = slot.job.request.tokens  # type: ignore[union-attr]
            if len(source.tokens) >= n and source.tokens[:n] == prompt[:n]:
                self._truncate(slot, 0)
                self.ctx.kv.seq_cp(source.seq_id, slot.seq_id, 0, n)
                # a recurrent state is the source's whole past: cut it back through its checkpoints
                self.checkpoints.copy(source.seq_id, slot.seq_id, n)
                slot.tokens = list(source.tokens)
                n = self._truncate(slot, n)
                self.stats.prompt_tokens_copied += n
                self.stats.prompt_tokens_reused -= slot.n_cached
                slot.n_cached = n
            elif source.state == PROMPT and source.job is source_job:
                continue  # still reading it: wait one more step
            slot.pending = prompt[len(slot.tokens):]
            slot.state, slot.copy_from = PROMPT, None

    # the batch
    def _decode_image(self) -> None:
        """Decodes the image a slot's prompt continues with, in a decode of its own (a batch holds
        tokens or embeddings, and an image may attend non-causally); one image per step, so that
        generating slots wait for one image at most."""
        for slot in self.slots:
            if slot.state != PROMPT or not slot.pending or slot.pending[0] >= 0:
                continue
            chunk = slot.job.request.media[slot.pending[0]]  # type: ignore[union-attr]
            try:
                eval_image(self.ctx, chunk, len(slot.tokens), slot.seq_id, self.n_batch)
            except DecodeError as e:
                self._fail(slot, JobFailed(f"the engine failed to decode an image: {e}"))
                return
            slot.tokens.extend(slot.pending[:chunk.n_pos])
            slot.pending = slot.pending[chunk.n_pos:]
            self.stats.prompt_tokens_decoded += chunk.n_pos
            if len(slot.pending) == 1:  # the state before the prompt's last token, as after text
                self.checkpoints.save(slot.seq_id, len(slot.tokens))
            return

    def _fill_batch(self) -> list[Slot]:
        """One token per generating slot, then prompt chunks in the room left; the slots with rows."""
        batch, rows = self._batch, []
        batch.clear()
        generating = [s for s in self.slots if s.state == GENERATING]
        for i, slot in enumerate(generating):
            n_after = len(generating) - 1 - i
            # the next token, then its drafted ones (rows i_batch, i_batch + 1, ...); room is
            # kept for the next tokens of the slots after it
            slot.i_batch = len(batch)
            batch.add(slot.next_token, len(slot.tokens), seq_ids=(slot.seq_id,), logits=True)
            slot.draft = self._draft(slot, self.n_batch - len(batch) - n_after)
            for k, t in enumerate(slot.draft):
                batch.add(t, len(slot.tokens) + 1 + k, seq_ids=(slot.seq_id,), logits=True)
            self.stats.drafted_tokens += len(slot.draft)
            rows.append(slot)
        for slot in self.slots:
            room = self.n_batch - len(batch)
            if slot.state != PROMPT or room <= 0 or not slot.pending or slot.pending[0] < 0:
                continue
            chunk = slot.pending[:room]
            if min(chunk) < 0:  # text up to the next image
                chunk = chunk[:next(i for i, t in enumerate(chunk) if t < 0)]
            if self.checkpoints.enabled and len(chunk) == len(slot.pending) > 1:
                chunk = chunk[:-1]  # the prompt's last token next step, after a checkpoint
            slot.n_in_batch = len(chunk)
            for k, t in enumerate(chunk):
                last = k == len(slot.pending) - 1
                batch.add(t, len(slot.tokens) + k, seq_ids=(slot.seq_id,), logits=last)
            slot.i_batch = len(batch) - 1 if len(chunk) == len(slot.pending) else -1
            rows.append(slot)
        return rows

    def _draft(self, slot: Slot, room: int) -> list[int]:
        """Tokens drafted after the slot's next token, as many as the batch, the slot's context
        and its max_tokens leave room for."""
        if self.drafter is None or room <= 0 or slot.job.request.media:  # type: ignore[union-attr]
            return []  # the drafters read tokens, and an image's positions hold none
        req = slot.job.request  # type: ignore[union-attr]
        left = (req.max_tokens - slot.n_generated - 1) if req.max_tokens is not None else room
        n_max = min(room, left, self.n_ctx_slot - len(slot.tokens) - 2)
        if self.model.is_recurrent:
            n_max = min(n_max, self.ctx.n_rs_seq)  # what a rollback can drop again
        if n_max <= 0:
            return []
        tokens = slot.tokens + [slot.next_token]
        predicted = predicted_draft(req.prediction, tokens[slot.n_prompt:], n_max) if req.prediction else []
        return predicted or self.drafter.draft(tokens, n_max, seq_id=slot.seq_id)[:n_max]

    def _decode(self, rows: list[Slot]) -> bool:
        """Decodes the batch; on an engine error, frees idle caches and retries, then fails
        the jobs one by one so that only the ones the engine refuses end."""
        try:
            self.ctx.decode(self._batch)
            return True
        except DecodeError:
            pass
        for slot in self.slots:
            if not slot.busy and slot.tokens:
                self._truncate(slot, 0)
        try:
            self.ctx.decode(self._batch)
            return True
        except DecodeError as e:
            log.error("decode failed twice (%s); failing %d jobs", e, len(rows))
            for slot in rows:
                self._fail(slot, JobFailed(f"the engine failed to decode: {e}"))
            return False

    def _advance(self, slot: Slot) -> None:
        """After a decode: record what the slot's row put in the cache, sample when it has logits."""
        if slot.state == GENERATING:
            slot.tokens.append(slot.next_token)  # type: ignore[arg-type]
            if slot.draft:
                self._verify(slot)
                return
        else:
            chunk = slot.pending[:slot.n_in_batch]
            slot.tokens.extend(chunk)
            self.stats.prompt_tokens_decoded += len(chunk)
            slot.pending = slot.pending[len(chunk):]
            if len(slot.pending) == 1:
                self.checkpoints.save(slot.seq_id, len(slot.tokens))
            if slot.i_batch < 0:
                return
        try:
            self._sample(slot)
        except Exception as e:  # a sampler error (a grammar with no way out) ends this job only
            log.warning("sampling failed in slot %d: %s", slot.seq_id, e)
            self._fail(slot, JobFailed(f"sampling failed: {e}"))

    def _verify(self, slot: Slot) -> None:
        """Samples the rows of the next token and the drafted ones in order, keeping drafted
        tokens while the slot's sampler picks them; the cells after the first miss go."""
        draft, base = slot.draft, len(slot.tokens)
        slot.tokens.extend(draft)
        for i in range(len(draft) + 1):
            try:
                token = self._sample(slot, slot.i_batch + i)
            except Exception as e:  # as in _advance: this job only
                self._truncate(slot, base + i)
                self._fail(slot, JobFailed(f"sampling failed: {e}"))
                return
            if token is not None and i < len(draft) and token == draft[i]:
                self.stats.accepted_tokens += 1
                continue
            # the cells of drafted tokens not kept (a recurrent state rolls back to a snapshot)
            if self._truncate(slot, base + i) != base + i:
                raise RuntimeError(f"slot {slot.seq_id}: the context could not drop a rejected draft")
            return

    def _sample(self, slot: Slot, row: int | None = None) -> int | None:
        """Samples the slot's token from a batch row and emits it; the token, or None when the
        job ended."""
        job, sampler = slot.job, slot.sampler
        assert job is not None and sampler is not None and slot.scanner is not None
        logits = self.ctx.logits(slot.i_batch if row is None else row)
        token = sampler.sample_logits(logits)
        sampler.accept(token)
        req = job.request
        logprob = token_logprob(logits, token, req.top_logprobs) if req.top_logprobs is not None else None
        if self.model.is_eog(token):
            self._finish(slot, Output("", token, logprob, "stop"))
            return None
        slot.n_generated += 1
        self.stats.generated_tokens += 1
        text, stopped = slot.scanner.push(self.model.token_to_piece(token, req.special))
        limit = req.max_tokens if req.max_tokens is not None else math.inf
        if stopped or slot.n_generated >= limit or len(slot.tokens) + 1 >= self.n_ctx_slot:
            text += "" if stopped else slot.scanner.flush()
            self._finish(slot, Output(text, token, logprob, "stop" if stopped else "length"))
            return None
        job._push(Output(text, token, logprob))
        slot.state, slot.next_token = GENERATING, token
        return token

    # endings
    def _usage(self, slot: Slot) -> dict[str, int]:
        return {"prompt_tokens": slot.n_prompt, "completion_tokens": slot.n_generated,
                "cached_tokens": slot.n_cached}

    def _finish(self, slot: Slot, last: Output) -> None:
        last.usage = self._usage(slot)
        job = slot.job
        self._free(slot)
        self.stats.requests_done += 1
        job._push(last)  # type: ignore[union-attr]

    def _fail(self, slot: Slot, error: BaseException) -> None:
        job = slot.job
        self._truncate(slot, 0)
        self._free(slot)
        self.stats.requests_failed += 1
        if job is not None:
            job._push(error)

    def _free(self, slot: Slot) -> None:
        """The slot goes idle; its cache keeps the tokens decoded (for the next prompt)."""
        if slot.state in (WAITING, PROMPT):
            self._truncate(slot, len(slot.tokens))
        slot.release()

    def _fail_all(self, error: BaseException, keep_queue: bool = False) -> None:
        for slot in self.slots:
            if slot.busy:
                self._fail(slot, error)
        if keep_queue:
            return
        with self._lock:
            waiting, self._queue = list(self._queue), collections.deque()
        for job in waiting:
            job._push(error)


def completion_logprobs(model: Model, outs: Sequence[Output], offset0: int = 0) -> dict:
    """OpenAI's completion logprobs (tokens, token_logprobs, top_logprobs, text_offset) of outputs
    whose text starts at offset0."""
    return _completion_logprobs(model, _entries(model, outs), offset0)


def _entries(model: Model, outs: Sequence[Output]) -> list[TokenLogprob]:
    return [o.logprob for o in outs if o.logprob is not None and not model.is_eog(o.logprob.token)]


def chat_logprobs(model: Model, outs: Sequence[Output]) -> dict | None:
    """OpenAI's chat logprobs of outputs."""
    return _chat_logprobs(model, _entries(model, outs))
