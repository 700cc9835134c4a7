#!/usr/bin/env python3
"""Builds the small synthetic vocabularies of tests/data/vocab (synth-ugm.gguf, synth-ugm-plain.gguf,
synth-rwkv.gguf, synth-plamo2.gguf) with the `gguf` package: a t5 (UGM) vocabulary with a hand-built
precompiled charsmap (llama.cpp's XOR-compressed double array layout), an RWKV one and a PLaMo-2 one. No real T5/RWKV/PLaMo-2 vocabulary ships
with the project; llama.cpp's results on these files are recorded in tests/data/vocab/synthetic.json.

Usage: python3 tools/make_synthetic_vocabs.py OUT_DIR
"""
import os
import random
import struct
import sys

import gguf

def xcda(mapping):
    """Hand-built XOR-compressed double array for prefix -> replacement (llama.cpp's layout)."""
    # trie
    root = {}
    for k, v in mapping.items():
        n = root
        for b in k: n = n.setdefault(b, {})
        n[None] = v
    repl = bytearray(); offsets = {}
    for v in mapping.values():
        if v not in offsets: offsets[v] = len(repl); repl += v + b'\0'
    arr = {}
    def build(node, idx):
        labels = [b for b in node if b is not None]
        lab = labels + ([0] if None in node else [])
        base = 1
        while any(((idx ^ base) ^ l) in arr or ((idx ^ base) ^ l) == 0 for l in lab):
            base += 1
        assert base < (1 << 21)
        arr[idx] = (arr.get(idx, 0) & 0x3FF) | (base << 10)
        origin = idx ^ base
        if None in node:
            arr[origin] = (1 << 31) | offsets[node[None]]
        for b in labels:
            arr[origin ^ b] = b | ((1 << 8) if None in node[b] else 0)
        for b in labels:
            build(node[b], origin ^ b)
    arr[0] = 0
    build(root, 0)
    # every node ^ byte the walk can compute must be inside the array
    n = max(max(arr), max(((i ^ (v >> 10)) | 0xFF) for i, v in arr.items() if not v >> 31)) + 1
    data = [arr[i] if i in arr else (1 << 31) for i in range(n)]
    blob = struct.pack('<%dI' % n, *data)
    return struct.pack('<I', len(blob)) + blob + bytes(repl)

def ugm(path, add_space_prefix=True, remove_extra_ws=True, charsmap=True):
    rng = random.Random(7)
    w = gguf.GGUFWriter(path, 't5')
    toks = ['<pad>', '</s>', '<unk>']; scores = [0.0, 0.0, 0.0]; types = [3, 3, 2]
    words = set()
    alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?-\'éü你好日本'
    for c in alphabet: words.add('▁' + c); words.add(c)
    for _ in range(600):
        s = ''.join(rng.choice('abcdefghijklmnopqrstuvwxyzéü') for _ in range(rng.randint(2, 6)))
        words.add(s); words.add('▁' + s)
    words.add('▁')
    for t in sorted(words):
        toks.append(t); scores.append(-rng.uniform(2, 12) - len(t) * 0.3); types.append(1)
    toks += ['<extra_id_0>', '<user>', 'usr', '<unused_9>']; scores += [0.0, 0.0, -1.5, 0.0]; types += [3, 4, 4, 5]
    w.add_tokenizer_model('t5')
    w.add_token_list(toks); w.add_token_scores(scores); w.add_token_types(types)
    w.add_add_space_prefix(add_space_prefix); w.add_remove_extra_whitespaces(remove_extra_ws)
    w.add_eos_token_id(1); w.add_unk_token_id(2); w.add_pad_token_id(0)
    if charsmap:
        m = {'Ａ'.encode(): b'A', 'ﬁ'.encode(): b'fi', '\u00a0'.encode(): b' ', b'\t': b' ', 'ℌ'.encode(): b'H', 'ｆｕｌｌ'.encode(): b'full', 'ｆ'.encode(): b'f', b'\r\n': b'\n'}
        w.add_precompiled_charsmap(xcda(m))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def rwkv(path):
    rng = random.Random(3)
    w = gguf.GGUFWriter(path, 'rwkv6')
    toks = []
    for b in range(256):
        c = bytes([b])
        if c == b'\\': toks.append('\\\\')
        elif b == 9: toks.append('\\t')
        elif b == 10: toks.append('\\n')
        elif b == 13: toks.append('\\r')
        elif 32 <= b < 127: toks.append(c.decode())
        else: toks.append('\\x%02x' % b)
    seen = set(toks)
    for _ in range(400):
        s = ''.join(rng.choice('abcdefghij klmn\n') for _ in range(rng.randint(2, 5))).replace('\n', '\\n')
        if s not in seen: seen.add(s); toks.append(s)
    for t in ['hello', ' world', 'é', '你好']:
        if t not in seen: seen.add(t); toks.append(t)
    w.add_tokenizer_model('rwkv')
    w.add_token_list(toks); w.add_token_types([1] * len(toks))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def plamo2(path):
    rng = random.Random(11)
    w = gguf.GGUFWriter(path, 'plamo2')
    toks = ['<|plamo:unk|>', '<|plamo:bos|>', '<|plamo:eos|>', '<|plamo:pad|>']
    scores = [0.0, 0.0, 0.0, 0.0]
    types = [2, 3, 3, 3]
    for b in range(256):
        toks.append('<0x%02X>' % b); scores.append(0.0); types.append(6)
    seen = set(toks)
    pieces = list('abcdefghijklmnopqrstuvwxyz .,!?') + ['é', 'ü', '你', '好', '日本', '▁']
    for _ in range(700):
        t = ''.join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        if t not in seen:
            seen.add(t); toks.append(t); scores.append(-rng.uniform(1, 15)); types.append(1)
    w.add_tokenizer_model('plamo2')
    w.add_token_list(toks); w.add_token_scores(scores); w.add_token_types(types)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


if __name__ == '__main__':
    out = sys.argv[1]
    ugm(os.path.join(out, 'synth-ugm.gguf'))
    ugm(os.path.join(out, 'synth-ugm-plain.gguf'), add_space_prefix=False, remove_extra_ws=False)
    rwkv(os.path.join(out, 'synth-rwkv.gguf'))
    plamo2(os.path.join(out, 'synth-plamo2.gguf'))
