"""Models from the Hugging Face Hub (``Llama.from_pretrained``), through huggingface-hub.

A file name may be a glob; it must match exactly one file of the repository. Without network
access huggingface-hub's own error comes through, as with llama-cpp-python.
"""
from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from typing import Any


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError("Llama.from_pretrained requires the huggingface-hub package. "
                          "You can install it with `pip install huggingface-hub`.") from None
    return huggingface_hub


def _one_match(repo_id: str, files: list[str], pattern: str) -> str:
    matches = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if not matches:
        raise ValueError(f"No file found in {repo_id} that match {pattern}\n\nAvailable Files:\n{json.dumps(files)}")
    if len(matches) > 1:
        raise ValueError(f"Multiple files found in {repo_id} matching {pattern}\n\nAvailable Files:\n{json.dumps(matches)}")
    return matches[0]


def download_model(repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                   local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                   cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Downloads the file matching ``filename`` (and ``additional_files``, e.g. the other parts of a
    split model) and returns the local path of the first."""
    hub = _hub()
    hub.utils.validate_repo_id(repo_id)
    if filename is None:
        raise ValueError("filename is needed: a file name or glob of the repository's GGUF file")
    listed = hub.HfFileSystem().ls(repo_id, recursive=True)
    files = [str(Path(f["name"] if isinstance(f, dict) else f).relative_to(repo_id)) for f in listed]
    paths = []
    for pattern in [filename, *(additional_files or [])]:
        match = Path(_one_match(repo_id, files, pattern))
        paths.append(hub.hf_hub_download(repo_id=repo_id, filename=match.name, subfolder=str(match.parent),
                                         local_dir=local_dir, cache_dir=cache_dir))
    del local_dir_use_symlinks  # huggingface-hub no longer takes it; files are copied or linked as it decides
    return paths[0]
