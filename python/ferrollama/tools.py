"""The former path of :mod:`ferrollama.chat.tools` (tool-call formats, parsing and grammars), kept
for the programs that import it from here."""
from .chat.tools import *  # noqa: F401,F403
from .chat.tools import __all__  # noqa: F401
