"""The former path of :mod:`ferrollama.generation.scheduler` (continuous batching over one Context),
kept for the programs that import it from here; ``ferrollama.server.Scheduler`` is the same class."""
from ..generation.scheduler import *  # noqa: F401,F403
from ..generation.scheduler import __all__  # noqa: F401
