"""``ferrollama serve``: an OpenAI-compatible server over continuous batching.

:class:`Scheduler` (slots over one Context; ferrollama.generation.scheduler's, named here too)
works without HTTP; :func:`create_app` (the app over a scheduler) and :func:`build_app` (the app
for ``ferrollama serve``'s flags) need the ``server`` extra (Starlette, uvicorn, pydantic,
prometheus-client).
"""
from ..generation.scheduler import Job, JobFailed, Output, QueueFull, Request, Scheduler

__all__ = ["Job", "JobFailed", "Output", "QueueFull", "Request", "Scheduler", "create_app", "build_app"]


def create_app(*args, **kwargs):
    from .app import create_app as make

    return make(*args, **kwargs)


def build_app(*args, **kwargs):
    from .build import build_app as build

    return build(*args, **kwargs)
