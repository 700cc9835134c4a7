"""``ferrollama serve``: an OpenAI-compatible server over continuous batching.

:class:`Scheduler` (slots over one Context) works without HTTP; :func:`create_app` needs the
``server`` extra (Starlette, uvicorn, pydantic, prometheus-client).
"""
from .scheduler import Job, JobFailed, Output, QueueFull, Request, Scheduler

__all__ = ["Job", "JobFailed", "Output", "QueueFull", "Request", "Scheduler", "create_app"]


def create_app(*args, **kwargs):
    from .app import create_app as make

    return make(*args, **kwargs)
