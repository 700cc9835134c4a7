"""``python -m ferrollama.cli``: the ``ferrollama`` command."""
import sys

from . import main

sys.exit(main())
