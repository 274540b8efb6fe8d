"""Offline tokenizers for the tiny models (workers/tiny.py, workers/tiny_flow.py): no
vocabulary is downloaded."""

from __future__ import annotations

import json
from pathlib import Path


def _bytes_to_unicode() -> list[str]:
    """CLIP's byte-level alphabet: 256 printable stand-ins for the 256 byte values."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


def _tokenizer_files(folder: Path) -> tuple[Path, Path, dict[str, int]]:
    """A byte-level BPE vocabulary with no merges: every byte is a token."""
    alphabet = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for ch in alphabet:
        vocab[f"{ch}</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    vocab_file = folder / "vocab.json"
    merges_file = folder / "merges.txt"
    vocab_file.write_text(json.dumps(vocab))
    merges_file.write_text("#version: 0.2\n")
    return vocab_file, merges_file, vocab
