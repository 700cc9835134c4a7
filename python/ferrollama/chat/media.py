"""Images and audio in chat messages (OpenAI's ``image_url`` and ``input_audio`` content parts),
as llama-cpp-python's MTMDChatHandler reads them: each part becomes the media marker in the text
the template renders, and its URL (or its audio's bytes) one of the prompt's media, in order."""
from __future__ import annotations

import base64
import binascii
from typing import Any, Sequence, Union

from ..generation.multimodal import MEDIA_MARKER


def _url_of(part: dict) -> str:
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError("an image_url content part needs a URL: {'type': 'image_url', 'image_url': {'url': ...}}")
    return url


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def _is_audio(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "input_audio"


def _is_media(part: Any) -> bool:
    return _is_image(part) or _is_audio(part)


def _audio_of(part: dict) -> bytes:
    """An input_audio part's file bytes: {"input_audio": {"data": base64, "format": "wav" | "mp3"}}."""
    audio = part.get("input_audio")
    data = audio.get("data") if isinstance(audio, dict) else None
    if not isinstance(data, str) or not data:
        raise ValueError("an input_audio content part needs base64 data: "
                         "{'type': 'input_audio', 'input_audio': {'data': ..., 'format': 'wav'}}")
    if audio.get("format", "wav") not in ("wav", "mp3"):
        raise ValueError(f"input_audio format {audio.get('format')!r}: OpenAI's are 'wav' and 'mp3'")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"input_audio data is not base64: {error}") from error


def media_sources(messages: Sequence[dict]) -> list[Union[str, bytes]]:
    """The messages' media in order: an image part's URL, an audio part's file bytes."""
    return [_url_of(part) if _is_image(part) else _audio_of(part) for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if _is_media(part)]


def image_urls(messages: Sequence[dict]) -> list[str]:
    """The URLs of the messages' image parts, in order."""
    return [_url_of(part) for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if _is_image(part)]


def with_media_markers(messages: Sequence[dict]) -> list[dict]:
    """The messages with each image or audio part replaced by a text part holding the media marker."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(_is_media(p) for p in content):
            m = {**m, "content": [{"type": "text", "text": MEDIA_MARKER} if _is_media(p) else p for p in content]}
        out.append(m)
    return out
