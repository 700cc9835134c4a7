"""The former path of :mod:`ferrollama.generation.speculative` (prompt lookup, draft models and the
verification loop), kept for the programs that import it from here."""
from .generation.speculative import *  # noqa: F401,F403
from .generation.speculative import __all__  # noqa: F401
