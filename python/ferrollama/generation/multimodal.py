"""Images in, as llama.cpp's libmtmd takes them: a projector file (mmproj) encodes an image into
rows of the text model's width, a prompt with media markers becomes chunks of text tokens and
image embeddings (mtmd_tokenize), and the chunks are decoded into a context
(mtmd_helper_eval_chunks). ``Llama``'s chat handlers, the server and the CLI all go through here.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Sequence, Union

import numpy as np

from .._core import Batch, Context, Model, UnsupportedError
from .._core import AudioProjector as _CoreAudioProjector
from .._core import Projector as _CoreProjector
from .._core import projector_has_audio, projector_has_vision
from .audio import WHISPER, AudioSource, is_audio, load_audio, whisper_mel_chunks
from .media import (DEFAULT_LIMITS, ImageSource, MediaError, MediaLimits, PreprocessedImage, VisionParams, load_image,
                    preprocess_image)

#: The text that stands for an image in a prompt (mtmd_default_marker).
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class TileTemplate:
    """mtmd_context's tokens around the chunks of a tiled image (llava-uhd style: an overview
    and a grid of slices, each a chunk of its own). Each entry of the tuples is the text of one
    token, looked up in the vocabulary as mtmd's lookup_token does; ``slice_start_format`` is
    text (special tokens parsed) formatted with the slice's 1-based row and column, used where
    ``slice_start`` is empty. The defaults are mtmd's: no tokens, the overview last."""

    overview_start: tuple[str, ...] = ()
    overview_end: tuple[str, ...] = ()
    slices_start: tuple[str, ...] = ()
    slices_end: tuple[str, ...] = ()
    slice_start: tuple[str, ...] = ()
    slice_end: tuple[str, ...] = ()
    slice_mid: tuple[str, ...] = ()
    row_end: tuple[str, ...] = ()
    #: the last row is followed by row_end too
    row_end_trail: bool = False
    overview_first: bool = False
    slice_start_format: str = ""

    def token_texts(self) -> set[str]:
        return {t for part in (self.overview_start, self.overview_end, self.slices_start, self.slices_end,
                               self.slice_start, self.slice_end, self.slice_mid, self.row_end) for t in part}


@dataclass(frozen=True)
class Family:
    """What a projector type adds around its images in the text model's input (mtmd_context's
    img_beg / img_end, and the tile template of a tiled image) and how the text model attends
    over them."""

    img_beg: str = ""
    img_end: str = ""
    #: the image's tokens see each other both ways (mtmd_decode_use_non_causal)
    non_causal: bool = False
    tiles: TileTemplate = TileTemplate()
    #: the image's tokens form a grid of (width / patch_size / 2) x (height / patch_size / 2)
    #: (clip_n_output_tokens_x / _y of the Qwen VL mergers: 2x2 patches per token), which a text
    #: model with M-RoPE positions in 2-D; for the others mtmd takes them as one row
    grid: bool = False
    #: text model widths whose images are decoded causally all the same (mtmd: Gemma 4's E2B
    #: and E4B, n_embd 1536 and 2560)
    causal_text_widths: tuple[int, ...] = ()

    def for_text_width(self, n_embd: int) -> "Family":
        """The family as it decodes images for a text model of width ``n_embd``."""
        return replace(self, non_causal=False) if n_embd in self.causal_text_widths else self


FAMILIES = {
    # <start_of_image> (the embeddings) <end_of_image>, decoded non-causally (mtmd.cpp)
    "gemma3": Family("<start_of_image>", "<end_of_image>", non_causal=True),
    # <fake_token_around_image><row_1_col_1> (slice) ... "\n" between rows, then "\n\n"
    # <fake_token_around_image><global-img> (overview) <fake_token_around_image> (mtmd.cpp, after
    # transformers' Idefics3 processor)
    "idefics3": Family(tiles=TileTemplate(
        overview_start=("\n\n", "<fake_token_around_image>", "<global-img>"), overview_end=("<fake_token_around_image>",),
        row_end=("\n",), slice_start_format="<fake_token_around_image><row_{row}_col_{col}>")),
    # LFM2-VL: <|image_start|> (image) <|image_end|>, causal; a tiled image's tiles each after
    # <|img_row_R_col_C|>, then <|img_thumbnail|> (the overview) before <|image_end|> (mtmd.cpp)
    "lfm2": Family("<|image_start|>", "<|image_end|>", tiles=TileTemplate(
        overview_start=("<|img_thumbnail|>",), slice_start_format="<|img_row_{row}_col_{col}|>")),
    # LLaVA 1.5 and the other llava-style MLP projectors: the embeddings alone, causal (mtmd.cpp
    # sets no image markers for PROJECTOR_TYPE_MLP)
    "mlp": Family(),
    # Qwen2-VL, Qwen2.5-VL, Qwen3-VL: <|vision_start|> (the embeddings) <|vision_end|>, causal,
    # a grid of tokens (at 2-D M-RoPE positions in their text models)
    "qwen2vl_merger": Family("<|vision_start|>", "<|vision_end|>", grid=True),
    "qwen2.5vl_merger": Family("<|vision_start|>", "<|vision_end|>", grid=True),
    "qwen3vl_merger": Family("<|vision_start|>", "<|vision_end|>", grid=True),
    # <|image> (the embeddings) <image|>, non-causal but for E2B and E4B (mtmd.cpp)
    "gemma4v": Family("<|image>", "<image|>", non_causal=True, causal_text_widths=(1536, 2560)),
    # Pixtral / Mistral Small 3.x: the image's rows of tokens with the [IMG_BREAK] embedding between
    # them, all from the projector (one chunk), then the [IMG_END] token; causal (mtmd.cpp)
    "pixtral": Family(img_end="[IMG_END]"),
    # MiniCPM-V 2.6 and later (clip.minicpmv_version 3+): <image> (overview) </image>, then each
    # slice between <slice> and </slice>, "\n" between rows; causal (mtmd.cpp)
    "resampler": Family(tiles=TileTemplate(
        overview_start=("<image>",), overview_end=("</image>",), slice_start=("<slice>",), slice_end=("</slice>",),
        row_end=("\n",), overview_first=True)),
    # Ultravox (audio): each 30 s chunk's embeddings alone, causal (mtmd.cpp sets no audio markers)
    "ultravox": Family(),
    # Qwen2-Audio (audio): <|audio_bos|> (every 30 s chunk of the audio) <|audio_eos|>, causal (mtmd.cpp)
    "qwen2a": Family("<|audio_bos|>", "<|audio_eos|>"),
    # Voxtral (audio): [BEGIN_AUDIO] then the chunks, nothing after them, causal (mtmd.cpp)
    "voxtral": Family("[BEGIN_AUDIO]"),
}

#: MiniCPM-V 2.5 (clip.minicpmv_version 2): the slices inside <slice> ... </slice>, each between
#: <image> and </image> (mtmd.cpp's MTMD_SLICE_TMPL_MINICPMV_2_5)
MINICPMV_2_5 = Family(tiles=TileTemplate(
    overview_start=("<image>",), overview_end=("</image>",), slices_start=("<slice>",), slices_end=("</slice>",),
    slice_start=("<image>",), slice_end=("</image>",), row_end=("\n",), overview_first=True))


def family_of(core: _CoreProjector) -> Family:
    """The family of a loaded projector (MiniCPM-V's slice tokens depend on its version)."""
    if core.projector_type == "resampler" and core.minicpmv_version == 2:
        return MINICPMV_2_5
    return FAMILIES[core.projector_type]


@dataclass
class TextChunk:
    tokens: list[int]

    @property
    def n_pos(self) -> int:
        return len(self.tokens)


@dataclass
class ImageChunk:
    """An image's embeddings (n_tokens rows of the text model's input width) and the positions
    they take; ``id`` identifies the image (a hash of its pixels), for prompt caches.

    For a text model with M-RoPE (``mrope``), the tokens are a grid of ``nx`` x ``ny`` (one row
    of n_tokens where the projector has no grid) at 2-D positions, and take max(nx, ny)
    positions of the sequence (mtmd_image_tokens_get_n_pos); else one position each."""

    embd: np.ndarray
    id: str
    non_causal: bool = False
    mrope: bool = False
    nx: int = 0
    ny: int = 1
    #: audio: with M-RoPE, every token at n_past + i in all four sections (mtmd's
    #: set_position_mrope_1d), not at an image's 2-D positions
    audio: bool = False

    def __post_init__(self) -> None:
        if self.nx == 0:
            self.nx = self.n_tokens
        if self.nx * self.ny != self.n_tokens:
            raise ValueError(f"a grid of {self.nx} x {self.ny} image tokens for {self.n_tokens} embedding rows")

    @property
    def n_tokens(self) -> int:
        return int(self.embd.shape[0])

    @property
    def n_pos(self) -> int:
        return max(self.nx, self.ny) if self.mrope else self.n_tokens

    def positions(self, n_past: int) -> np.ndarray:
        """The tokens' M-RoPE positions after n_past (mtmd_image_tokens_get_decoder_pos): time
        n_past, height n_past + row, width n_past + column, extra 0, in raster order; an audio
        chunk's n_past + i in each section."""
        i = np.arange(self.n_tokens)
        if self.audio:
            return np.repeat((n_past + i)[:, None], 4, axis=1)
        return np.stack([np.full_like(i, n_past), n_past + i // self.nx, n_past + i % self.nx, np.zeros_like(i)], axis=1)


Chunk = Union[TextChunk, ImageChunk]


@dataclass
class EncodedImage:
    """An image as a prompt shows it (mtmd's add_media): its image chunks (one, or a tiled
    image's overview and slices, each with its own ``id``) and the tokens around them, in order."""

    parts: list[Union[list[int], ImageChunk]]

    @property
    def chunks(self) -> list[ImageChunk]:
        return [p for p in self.parts if isinstance(p, ImageChunk)]

    @property
    def embd(self) -> np.ndarray:
        """Every chunk's embeddings, in the prompt's order."""
        return np.concatenate([c.embd for c in self.chunks])


def vision_params(core: _CoreProjector) -> VisionParams:
    """A loaded projector's preprocessing hyper-parameters."""
    return VisionParams(image_size=core.image_size, patch_size=core.patch_size, image_mean=tuple(core.image_mean),
                        image_std=tuple(core.image_std), n_merge=core.n_merge, image_longest_edge=core.image_longest_edge,
                        grid_pinpoints=tuple(core.grid_pinpoints))


@dataclass
class Projector:
    """A projector file for a text model: ``encode`` gives an image's embeddings, ``tokenize``
    the chunks of a prompt with media markers, ``eval`` decodes a prompt with images.

    A file with an audio encoder takes audio where the images go; Qwen2.5-Omni's file holds both
    encoders (``core`` the vision one, ``audio_core`` the audio one) and takes either, told apart
    by the media (a WAV file's header, a float array of samples), as mtmd does.

    ``model`` is the text model (its width must be the projector's output width)."""

    model: Model
    path: Union[str, os.PathLike]
    n_threads: Union[int, None] = None
    use_mmap: bool = True
    limits: MediaLimits = DEFAULT_LIMITS
    core: _CoreProjector = field(init=False, repr=False)
    family: Family = field(init=False)

    def __post_init__(self) -> None:
        path = os.fspath(self.path)
        has_audio = projector_has_audio(path)
        #: audio only: every medium is taken as audio
        self.is_audio = has_audio and not projector_has_vision(path)
        self.audio_core = None
        if has_audio:
            self.audio_core = _CoreAudioProjector(path, n_threads=self.n_threads, use_mmap=self.use_mmap)
            self.audio_family = FAMILIES[self.audio_core.projector_type]
        self.core = self.audio_core if self.is_audio else _CoreProjector(path, n_threads=self.n_threads, use_mmap=self.use_mmap)
        for core in [self.core] + ([self.audio_core] if self.audio_core not in (None, self.core) else []):
            if core.n_embd_out != self.model.n_embd_inp:
                raise ValueError(f"the projector {path!r} gives rows of {core.n_embd_out} values, "
                                 f"the text model's input width is {self.model.n_embd_inp}: they are not a pair")
        if self.is_audio:
            self.family = self.audio_family
            self._tile_tokens = {}
            return
        self.family = family_of(self.core).for_text_width(self.model.n_embd)
        self.vision = vision_params(self.core)
        self._tile_tokens = _lookup_tokens(self.model, self.family.tiles.token_texts())

    @property
    def projector_type(self) -> str:
        return self.core.projector_type

    def encode(self, image: ImageSource) -> np.ndarray:
        """The embeddings of an image (a path, bytes, a PIL image or an RGB array): a float32
        array of (n_image_tokens, n_embd); a tiled image's chunks one after the other, in the
        order a prompt shows them."""
        return self.encode_image(image).embd

    def encode_image(self, image: Union[ImageSource, AudioSource]) -> EncodedImage:
        """An image's chunks and the family's tokens around them, for ``tokenize`` (an audio
        projector's: the audio's, see ``encode_audio``)."""
        if self.is_audio or (self.audio_core is not None and _is_audio_source(image)):
            return self.encode_audio(image)
        if isinstance(image, (bytes, bytearray, memoryview)) and is_audio(bytes(image[:12])):
            raise MediaError(f"audio given to the {self.projector_type} projector, which takes images")
        rgb = load_image(image, self.limits)
        digest = hashlib.sha256(np.ascontiguousarray(rgb).tobytes() + repr(rgb.shape).encode()).hexdigest()
        pre = preprocess_image(self.projector_type, rgb, self.vision)
        parts: list[Union[list[int], ImageChunk]] = [self._marker_tokens(self.family.img_beg)]
        if pre.overview is not None or (pre.grid_x > 0 and pre.grid_y > 0):
            chunks = [self._chunk(f"{digest}:{i}", [p]) for i, p in enumerate(_overview_first(pre))]
            parts += self._tiled_parts(chunks[0], chunks[1:], pre.grid_x, pre.grid_y)
        else:
            parts.append(self._chunk(f"{digest}:0", pre.entries))
        parts.append(self._marker_tokens(self.family.img_end))
        return EncodedImage(parts)

    def _chunk(self, chunk_id: str, entries: Sequence[np.ndarray]) -> ImageChunk:
        """The image chunk of encoder inputs (float32 (height, width, 3) images), its grid the
        first one's where the family has one (mtmd: clip_n_output_tokens_x / _y of entry 0)."""
        embd = np.concatenate([self.core.encode_pixels(entry) for entry in entries])
        nx, ny = 0, 1
        if self.family.grid and self.model.uses_mrope:
            height, width = entries[0].shape[:2]
            nx, ny = width // self.core.patch_size // 2, height // self.core.patch_size // 2
        return ImageChunk(embd, chunk_id, self.family.non_causal, self.model.uses_mrope, nx, ny)

    def encode_audio(self, audio: AudioSource) -> EncodedImage:
        """Audio (a path, a file's bytes, or float samples at the projector's sample rate) as a
        prompt shows it: one chunk per 30 s of log-mel spectrogram (mtmd's add_media)."""
        core, family = self.audio_core, getattr(self, "audio_family", None)
        if core is None or family is None:
            raise MediaError(f"audio given to the {self.projector_type} projector, which takes images")
        if isinstance(audio, np.ndarray) and audio.dtype == np.uint8:
            raise MediaError(f"an image given to the {core.projector_type} projector, which takes audio")
        samples = load_audio(audio, core.sample_rate, self.limits)
        digest = hashlib.sha256(samples.tobytes()).hexdigest()
        mels = whisper_mel_chunks(samples, WHISPER(core.n_mel))
        chunks = [ImageChunk(core.encode_mel(mel), f"{digest}:{i}", family.non_causal, self.model.uses_mrope, audio=True)
                  for i, mel in enumerate(mels)]
        return EncodedImage([self._marker_tokens(family.img_beg), *chunks, self._marker_tokens(family.img_end)])

    def _tiled_parts(self, overview: ImageChunk, slices: list[ImageChunk], n_col: int,
                     n_row: int) -> list[Union[list[int], ImageChunk]]:
        """mtmd's add_media for a tiled image: the overview before or after the slices, each
        slice between its tokens, rows ended (the last one where the family says so)."""
        tpl, ids = self.family.tiles, self._tile_tokens
        tokens = lambda texts: [ids[t] for t in texts]  # noqa: E731
        ov = [tokens(tpl.overview_start), overview, tokens(tpl.overview_end)]
        parts: list[Union[list[int], ImageChunk]] = ov if tpl.overview_first else []
        if slices:
            if len(slices) != n_row * n_col:
                raise ValueError(f"{len(slices)} slices for a grid of {n_col}x{n_row}")
            parts.append(tokens(tpl.slices_start))
            for y in range(n_row):
                for x in range(n_col):
                    if tpl.slice_start or not tpl.slice_start_format:
                        parts.append(tokens(tpl.slice_start))
                    else:
                        parts.append(self._marker_tokens(tpl.slice_start_format.format(row=y + 1, col=x + 1)))
                    parts += [slices[y * n_col + x], tokens(tpl.slice_end)]
                    if x != n_col - 1:
                        parts.append(tokens(tpl.slice_mid))
                if y != n_row - 1 or tpl.row_end_trail:
                    parts.append(tokens(tpl.row_end))
            parts.append(tokens(tpl.slices_end))
        return parts + ([] if tpl.overview_first else ov)

    def tokenize(self, text: str, images: Sequence[Union[ImageSource, EncodedImage]] = (), add_special: bool = True,
                 parse_special: bool = True) -> list[Chunk]:
        """mtmd_tokenize: the text split at MEDIA_MARKER, each piece tokenized on its own (no
        BOS), each image's chunks between the family's tokens; then BOS before the first chunk (a
        chunk of its own if the prompt starts with an image) and EOS after, where the model adds
        them and ``add_special`` is set. An image already encoded (an EncodedImage) is taken as it is."""
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
            image = next(pending)
            for part in (image if isinstance(image, EncodedImage) else self.encode_image(image)).parts:
                if isinstance(part, ImageChunk):
                    chunks.append(part)
                else:
                    _add_text(chunks, part)
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


def _is_audio_source(source: object) -> bool:
    """Whether a medium given to a projector with both encoders is audio: a WAV file (bytes or a
    path, by mtmd's header check) or a 1-D float array of samples; anything else is an image."""
    if isinstance(source, np.ndarray):
        return source.ndim == 1 and source.dtype.kind == "f"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return is_audio(bytes(source[:12]))
    if isinstance(source, (str, os.PathLike)) and not str(source).startswith(("data:", "http://", "https://")):
        try:
            with open(str(source).removeprefix("file://"), "rb") as f:
                return is_audio(f.read(12))
        except OSError:
            return False  # the image loader names what is wrong with it
    return False


def _overview_first(pre: PreprocessedImage) -> list[np.ndarray]:
    """A tiled image's encoder inputs, the overview first (mtmd's split_batch_to_chunk, which
    requires one)."""
    if pre.overview is None:
        raise ValueError("a tiled image without an overview: mtmd has no layout for it")
    return [pre.overview, *pre.entries]


def _lookup_tokens(model: Model, texts: set[str]) -> dict[str, int]:
    """mtmd's lookup_token for each text: the first token whose piece (special tokens as their
    text) is that text. A text no token spells is refused (mtmd would put an invalid token)."""
    found: dict[str, int] = {}
    wanted = {t.encode(): t for t in texts}
    for token in range(model.n_vocab if wanted else 0):
        text = wanted.get(model.token_to_piece(token, True))
        if text is not None and text not in found:
            found[text] = token
            if len(found) == len(wanted):
                break
    missing = sorted(set(texts) - set(found))
    if missing:
        raise ValueError(f"the text model has no token for {', '.join(map(repr, missing))}, which the projector's images need")
    return found


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
    """A negative number that stands for each of an image chunk's positions in a list of prompt
    tokens (never a token id): the same image (and slice), the same key, so that a cached prefix
    with that image in it is reused; the chunks of a tiled image have keys of their own."""
    return -1 - (int(hashlib.sha256(chunk.id.encode()).hexdigest()[:8], 16) >> 1)


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
    """mtmd_helper_decode_image_chunk: the embeddings at positions n_past.. (at their M-RoPE
    positions after n_past for a text model with M-RoPE), no logits; causal attention off
    meanwhile where the family says so (restored whatever happens). Returns n_past advanced by
    the image's positions."""
    was_causal = ctx.causal_attn
    if chunk.non_causal:
        ctx.causal_attn = False
    positions = chunk.positions(n_past) if chunk.mrope else None
    try:
        for start in range(0, chunk.n_tokens, n_batch):
            rows = np.ascontiguousarray(chunk.embd[start:start + n_batch], dtype=np.float32)
            if positions is None:
                ctx.decode(Batch.from_embeddings(rows, n_past + start, seq_id, "none"))
            else:
                ctx.decode(Batch.from_embeddings(rows, seq_id=seq_id, logits="none", positions=positions[start:start + n_batch]))
    finally:
        ctx.causal_attn = was_causal
    return n_past + chunk.n_pos
