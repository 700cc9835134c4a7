"""A ferrollama server for tests: uvicorn on 127.0.0.1, a free port, in a thread of this process."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from ferrollama.server.app import create_app
from ferrollama.server.scheduler import Scheduler


class ServerThread:
    """Serves an app until stop(); url is http://127.0.0.1:PORT."""

    def __init__(self, app):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def start_server(model, n_seq: int = 4, n_ctx: int = 4096, queue_size: int = 64, api_key: str | None = None,
                 n_threads: int = 2, drafter=None, projector=None, batch_invariant: bool = False) -> tuple[ServerThread, Scheduler]:  # noqa: ANN001
    scheduler = Scheduler(model, n_ctx=n_ctx, n_seq=n_seq, n_threads=n_threads, queue_size=queue_size, drafter=drafter,
                          batch_invariant=batch_invariant)
    server = ServerThread(create_app(scheduler, model_name="qwen", api_key=api_key, projector=projector)).start()
    return server, scheduler


def wait_idle(scheduler: Scheduler, seconds: float = 30) -> bool:
    """Whether every slot is idle and the queue empty within a bounded wait."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if scheduler.slots_busy == 0 and scheduler.queue_length == 0:
            return True
        time.sleep(0.05)
    return False
