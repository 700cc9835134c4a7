"""The ``ferrollama`` command: one module per subcommand, sharing an argument table (common.py).

Errors a person can act on (a missing or malformed file, an unsupported type or architecture, a
prompt longer than the context, a bad flag value) are one line on stderr and exit status 1;
``--verbose`` adds the traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings
from typing import Sequence

from .common import ArgumentParser, CLIError

#: subcommand -> (module, one-line help)
COMMANDS = {
    "generate": ("generate", "generate text from a prompt (llama-cli / llama-completion)"),
    "chat": ("chat", "talk with the model through its chat template"),
    "bench": ("bench", "measure prompt processing and generation speed (llama-bench)"),
    "inspect": ("inspect", "print a GGUF file's header, metadata and tensors (gguf-dump)"),
    "tokenize": ("tokenize", "print the tokens of a text (llama-tokenize)"),
    "perplexity": ("perplexity", "perplexity and KL divergence over a text (llama-perplexity)"),
    "imatrix": ("imatrix", "compute an importance matrix over a text for quantize --imatrix (llama-imatrix)"),
    "quantize": ("quantize", "convert an F32/F16/BF16 model to another type (llama-quantize)"),
    "embed": ("embed", "print embeddings of texts (llama-embedding)"),
    "serve": ("serve", "an OpenAI-compatible HTTP server batching concurrent requests (llama-server)"),
    "batch": ("batch", "answer every prompt of a JSONL file, in process or on a Ray cluster"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ferrollama", description="llama.cpp's engine rebuilt in Rust.")
    from .._core import __version__

    parser.add_argument("--version", action="version", version=f"ferrollama {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(f"{__name__}.{module}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _parser=p)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments; an unknown flag is reported by its command's parser ("ferrollama generate:
    unrecognized arguments"), which argparse would leave to the top-level one."""
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, as llama.cpp's tools print theirs."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _error_message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0] if "\n" in text and not isinstance(exc, CLIError) else text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ferrollama``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            args = parse_args(argv)
            return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 1
    except SystemExit as e:  # --help, --version
        return int(e.code or 0) if isinstance(e.code, int) else 1
    except _actionable() as e:
        if verbose:
            traceback.print_exc()
        print(f"error: {_error_message(e)}", file=sys.stderr)
        return 1


def _actionable() -> tuple[type[BaseException], ...]:
    """Errors that say what the user can fix: one line. Anything else is a bug: a traceback."""
    from .._core import Error
    from ..models import ModelNotAvailable

    return (CLIError, Error, ValueError, OSError, ModelNotAvailable)


def run() -> None:
    sys.exit(main())
