"""Images in chat messages (OpenAI's ``image_url`` content parts), as llama-cpp-python's
MTMDChatHandler reads them: each part becomes the media marker in the text the template renders,
and its URL one of the prompt's images, in order."""
from __future__ import annotations

from typing import Any, Sequence

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


def image_urls(messages: Sequence[dict]) -> list[str]:
    """The URLs of the messages' image parts, in order."""
    return [_url_of(part) for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if _is_image(part)]


def with_media_markers(messages: Sequence[dict]) -> list[dict]:
    """The messages with each image part replaced by a text part holding the media marker."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(_is_image(p) for p in content):
            m = {**m, "content": [{"type": "text", "text": MEDIA_MARKER} if _is_image(p) else p for p in content]}
        out.append(m)
    return out
