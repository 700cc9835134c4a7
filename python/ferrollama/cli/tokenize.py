"""``ferrollama tokenize``: the tokens of a text and their pieces (llama-tokenize).

Each line is ``%6d -> 'piece'``; pieces that are not UTF-8 on their own (byte tokens) are shown
with \\x escapes and marked. --ids prints only the list of ids.
"""
from __future__ import annotations

import argparse
import sys

from .common import CLIError, load_model, process_escapes, read_text_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="FNAME", help="the GGUF model (default: Qwen2.5-Coder-0.5B-Instruct)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help="the text")
    src.add_argument("-f", "--file", metavar="FNAME", default=None, help="a file holding the text")
    src.add_argument("--stdin", action="store_true", help="read the text from stdin")
    p.add_argument("--ids", action="store_true", help="print only the token ids, as a list")
    p.add_argument("--no-bos", action="store_true", help="do not add the special tokens the model asks for (BOS)")
    p.add_argument("--no-parse-special", action="store_true", help="treat special-token text as plain text")
    p.add_argument("--no-escape", dest="escape", action="store_false", default=True,
                   help="do not process escapes in -p")
    p.add_argument("--show-count", action="store_true", help="print the number of tokens")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def _text(args: argparse.Namespace) -> str:
    if args.file is not None:
        return read_text_file(args.file, "text file")
    if args.stdin:
        data = sys.stdin.buffer.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CLIError(f"stdin: not UTF-8 text (byte {e.start})") from None
    if args.prompt is None:
        raise CLIError("give the text with -p, -f or --stdin")
    return process_escapes(args.prompt) if args.escape else args.prompt


def _show(piece: bytes) -> str:
    try:
        return f"'{piece.decode('utf-8')}'"
    except UnicodeDecodeError:
        return "'" + "".join(f"\\x{b:02x}" for b in piece) + "' (utf-8 decode failure)"


def run(args: argparse.Namespace) -> int:
    text = _text(args)
    model = load_model(args, vocab_only=True)
    tokens = list(model.tokenize(text, add_special=not args.no_bos, parse_special=not args.no_parse_special))
    out = sys.stdout
    if args.ids:
        print("[" + ", ".join(str(t) for t in tokens) + "]", file=out)
    else:
        for t in tokens:
            print(f"{t:6d} -> {_show(model.token_to_piece(t, True))}", file=out)
    if args.show_count:
        print(f"Total number of tokens: {len(tokens)}", file=out)
    return 0
