"""Images in, as llama.cpp's libmtmd takes them: a projector file (mmproj) encodes an image into
rows of the text model's width, a prompt with media markers becomes chunks of text tokens and
image embeddings (mtmd_tokenize), and the chunks are decoded into a context
(mtmd_helper_eval_chunks). ``Llama``'s chat handlers, the server and the CLI all go through here.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from .._core import Batch, Context, Model, UnsupportedError
from .._core import Projector as _CoreProjector
from .media import DEFAULT_LIMITS, ImageSource, MediaLimits, VisionParams, load_image, preprocess_image

#: The text that stands for an image in a prompt (mtmd_default_marker).
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class Family:
    """What a projector type adds around its images in the text model's input (mtmd_context's
    img_beg / img_end) and how the text model attends over them."""

    img_beg: str = ""
    img_end: str = ""
    #: the image's tokens see each other both ways (mtmd_decode_use_non_causal)
    non_causal: bool = False


FAMILIES = {
    # <start_of_image> (the embeddings) <end_of_image>, decoded non-causally (mtmd.cpp)
    "gemma3": Family("<start_of_image>", "<end_of_image>", non_causal=True),
    # LLaVA 1.5 and the other llava-style MLP projectors: the embeddings alone, causal (mtmd.cpp
    # sets no image markers for PROJECTOR_TYPE_MLP)
    "mlp": Family(),
}


@dataclass
class TextChunk:
    tokens: list[int]

    @property
    def n_pos(self) -> int:
        return len(self.tokens)


@dataclass
class ImageChunk:
    """An image's embeddings (n_tokens rows of the text model's width) and the positions they
    take; ``id`` identifies the image (a hash of its pixels), for prompt caches."""

    embd: np.ndarray
    id: str
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.embd.shape[0])

    @property
    def n_pos(self) -> int:
        return self.n_tokens


Chunk = Union[TextChunk, ImageChunk]


@dataclass
class Projector:
    """A projector file for a text model: ``encode`` gives an image's embeddings, ``tokenize``
    the chunks of a prompt with media markers, ``eval`` decodes a prompt with images.

    ``model`` is the text model (its width must be the projector's output width)."""

    model: Model
    path: Union[str, os.PathLike]
    n_threads: Union[int, None] = None
    use_mmap: bool = True
    limits: MediaLimits = DEFAULT_LIMITS
    core: _CoreProjector = field(init=False, repr=False)
    family: Family = field(init=False)

    def __post_init__(self) -> None:
        self.core = _CoreProjector(os.fspath(self.path), n_threads=self.n_threads, use_mmap=self.use_mmap)
        if self.core.n_embd_out != self.model.n_embd:
            raise ValueError(f"the projector {os.fspath(self.path)!r} gives rows of {self.core.n_embd_out} values, "
                             f"the text model's width is {self.model.n_embd}: they are not a pair")
        self.family = FAMILIES[self.core.projector_type]
        self.vision = VisionParams(image_size=self.core.image_size, patch_size=self.core.patch_size,
                                   image_mean=tuple(self.core.image_mean), image_std=tuple(self.core.image_std),
                                   n_merge=self.core.n_merge, grid_pinpoints=tuple(self.core.grid_pinpoints))
        if self.vision.grid_pinpoints:
            # mtmd_tokenize gives the overview and each anyres tile a chunk of its own
            raise UnsupportedError(f"{os.fspath(self.path)!r} has clip.vision.image_grid_pinpoints: LLaVA 1.6's "
                                   "tiles (an image chunk each) are not supported yet")

    @property
    def projector_type(self) -> str:
        return self.core.projector_type

    def encode(self, image: ImageSource) -> np.ndarray:
        """The embeddings of an image (a path, bytes, a PIL image or an RGB array): a float32
        array of (n_image_tokens, n_embd)."""
        return self._encode_rgb(load_image(image, self.limits))

    def _encode_rgb(self, rgb: np.ndarray) -> np.ndarray:
        pre = preprocess_image(self.projector_type, rgb, self.vision)
        return np.concatenate([self.core.encode_pixels(entry) for entry in pre.entries])

    def image_chunk(self, image: ImageSource) -> ImageChunk:
        rgb = load_image(image, self.limits)
        digest = hashlib.sha256(np.ascontiguousarray(rgb).tobytes() + repr(rgb.shape).encode()).hexdigest()
        return ImageChunk(self._encode_rgb(rgb), digest, self.family.non_causal)

    def tokenize(self, text: str, images: Sequence[Union[ImageSource, ImageChunk]] = (), add_special: bool = True,
                 parse_special: bool = True) -> list[Chunk]:
        """mtmd_tokenize: the text split at MEDIA_MARKER, each piece tokenized on its own (no
        BOS), each image wrapped in the family's markers; then BOS before the first chunk (a
        chunk of its own if the prompt starts with an image) and EOS after, where the model adds
        them and ``add_special`` is set. An image already encoded (an ImageChunk) is taken as it is."""
        pieces = _split_markers(text)
        n_markers = sum(p == MEDIA_MARKER for p in pieces)
        if n_markers != len(images):
            raise ValueError(f"the prompt has {n_markers} media marker(s) {MEDIA_MARKER!r} for {len(images)} image(s)")
        chunks: list[Chunk] = []
        pending = iter(images)
        for piece in pieces:
            if piece != MEDIA_MARKER:
                _add_text(chunks, self.model.tokenize(piece, add_special=False, parse_special=parse_special))
                continue
            _add_text(chunks, self._marker_tokens(self.family.img_beg))
            image = next(pending)
            chunks.append(image if isinstance(image, ImageChunk) else self.image_chunk(image))
            _add_text(chunks, self._marker_tokens(self.family.img_end))
        if add_special and self.model.add_bos and self.model.bos is not None:
            if chunks and isinstance(chunks[0], TextChunk):
                chunks[0].tokens.insert(0, self.model.bos)
            else:
                chunks.insert(0, TextChunk([self.model.bos]))
        if add_special and self.model.add_eos and self.model.eos is not None:
            _add_text(chunks, [self.model.eos])
        return chunks

    def _marker_tokens(self, marker: str) -> list[int]:
        return self.model.tokenize(marker, add_special=False, parse_special=True) if marker else []

    def eval(self, ctx: Context, text: str, images: Sequence[ImageSource] = (), n_past: int = 0, seq_id: int = 0,
             n_batch: Union[int, None] = None, logits_last: bool = True) -> int:
        """Decodes a prompt with images into ``ctx`` from position ``n_past`` of ``seq_id``
        (mtmd_helper_eval_chunks) and returns the position after it; ``ctx.logits(-1)`` is then
        the last text token's."""
        return eval_chunks(ctx, self.tokenize(text, images), n_past, seq_id, n_batch, logits_last)


def _split_markers(text: str) -> list[str]:
    """The text's pieces and markers, in order, without empty pieces (mtmd's split_text)."""
    pieces: list[str] = []
    for i, part in enumerate(text.split(MEDIA_MARKER)):
        if i > 0:
            pieces.append(MEDIA_MARKER)
        if part:
            pieces.append(part)
    return pieces


def _add_text(chunks: list[Chunk], tokens: list[int]) -> None:
    """Appends tokens to the last chunk if it is text, else as a new chunk."""
    if not tokens:
        return
    if chunks and isinstance(chunks[-1], TextChunk):
        chunks[-1].tokens.extend(tokens)
    else:
        chunks.append(TextChunk(list(tokens)))


def image_key(chunk: ImageChunk) -> int:
    """A negative number that stands for each of an image's positions in a list of prompt tokens
    (never a token id): the same image, the same key, so that a cached prefix with that image in
    it is reused."""
    return -1 - (int(chunk.id[:8], 16) >> 1)


def prompt_keys(chunks: Sequence[Chunk]) -> tuple[list[int], dict[int, ImageChunk]]:
    """The prompt as a list of keys (text tokens as they are, an image's positions as its
    ``image_key``) and the images by key."""
    keys: list[int] = []
    images: dict[int, ImageChunk] = {}
    for chunk in chunks:
        if isinstance(chunk, TextChunk):
            keys.extend(chunk.tokens)
        else:
            key = image_key(chunk)
            images[key] = chunk
            keys.extend([key] * chunk.n_pos)
    return keys, images


def key_runs(keys: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of the runs of text tokens and of each image's positions in a key list."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or (keys[i] < 0) != (keys[start] < 0) or (keys[i] < 0 and keys[i] != keys[start]):
            runs.append((start, i))
            start = i
    return runs


def whole_image_prefix(keys: Sequence[int], keep: int) -> int:
    """`keep`, or the start of the image it would cut: an image decodes only whole."""
    while 0 < keep < len(keys) and keys[keep] < 0 and keys[keep - 1] == keys[keep]:
        keep -= 1
    return keep


def n_pos(chunks: Sequence[Chunk]) -> int:
    """The positions a prompt's chunks take (mtmd_helper_get_n_pos)."""
    return sum(c.n_pos for c in chunks)


def eval_chunks(ctx: Context, chunks: Sequence[Chunk], n_past: int = 0, seq_id: int = 0,
                n_batch: Union[int, None] = None, logits_last: bool = True) -> int:
    """mtmd_helper_eval_chunks: text in batches of at most ``n_batch`` tokens (the context's by
    default), logits for the last token of the last chunk only; each image's embeddings in
    batches of ``n_batch`` rows, non-causally where the family decodes so. Returns the new n_past."""
    n_batch = ctx.n_batch if n_batch is None else n_batch
    if n_batch < 1:
        raise ValueError(f"n_batch must be positive, not {n_batch}")
    for i, chunk in enumerate(chunks):
        last = logits_last and i == len(chunks) - 1
        if isinstance(chunk, TextChunk):
            n_past = _eval_text(ctx, chunk.tokens, n_past, seq_id, n_batch, last)
        else:
            n_past = eval_image(ctx, chunk, n_past, seq_id, n_batch)
    return n_past


def _eval_text(ctx: Context, tokens: list[int], n_past: int, seq_id: int, n_batch: int, logits_last: bool) -> int:
    for start in range(0, len(tokens), n_batch):
        part = tokens[start:start + n_batch]
        is_last = logits_last and start + n_batch >= len(tokens)
        ctx.decode(Batch.from_tokens(part, n_past, seq_id, "last" if is_last else "none"))
        n_past += len(part)
    return n_past


def eval_image(ctx: Context, chunk: ImageChunk, n_past: int, seq_id: int, n_batch: int) -> int:
    """mtmd_helper_decode_image_chunk: the embeddings at positions n_past.., no logits; causal
    attention off meanwhile where the family says so (restored whatever happens)."""
    was_causal = ctx.causal_attn
    if chunk.non_causal:
        ctx.causal_attn = False
    try:
        for start in range(0, chunk.n_tokens, n_batch):
            rows = np.ascontiguousarray(chunk.embd[start:start + n_batch], dtype=np.float32)
            ctx.decode(Batch.from_embeddings(rows, n_past + start, seq_id, "none"))
    finally:
        ctx.causal_attn = was_causal
    return n_past + chunk.n_pos
