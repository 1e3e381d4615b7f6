"""Prompt tokenizers for the text encoder: the umT5 SentencePiece vocabulary or a built-in byte vocabulary.

Both produce what Wan's text pipeline feeds umT5: whitespace-cleaned text, one EOS token `</s>` at
the end, truncated to `text_len` with the EOS kept as the last token (as Hugging Face truncation does
when special tokens are added), right-padded with the pad id, plus a 0/1 attention mask.
"""

from __future__ import annotations

import html
import re
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from torch import Tensor

from workers.models.checkpoint_files import tokenizer_path
from workers.models.presets import T5Config

UMT5_TOKENIZER_RELPATH = Path("google") / "umt5-xxl" / "tokenizer.json"

_WHITESPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Collapse whitespace runs and strip, after undoing (double) HTML escaping.

    Wan additionally runs `ftfy.fix_text`; that repairs mojibake only and is skipped to avoid the
    dependency, so prompts with broken encodings may tokenize slightly differently.
    """
    text = html.unescape(html.unescape(text))
    return _WHITESPACE.sub(" ", text).strip()


class TextTokenizer(ABC):
    """Common framing: clean, encode, append EOS, truncate, pad. Subclasses only map text to ids."""

    def __init__(self, text_len: int, eos_id: int, pad_id: int) -> None:
        if text_len < 1:
            raise ValueError(f"text_len must be at least 1, got {text_len}")
        self.text_len = text_len
        self.eos_id = eos_id
        self.pad_id = pad_id

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids for already-cleaned texts, without any special tokens."""

    def __call__(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Returns (ids [B, text_len] long, mask [B, text_len] long), mask 1 on real tokens and EOS."""
        if isinstance(texts, str):
            # A bare string would otherwise be tokenized character by character.
            raise TypeError("texts must be a list of strings, not a single string")
        encoded = self._encode_batch([clean_text(t) for t in texts])
        ids = torch.full((len(texts), self.text_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(texts), self.text_len), dtype=torch.long)
        for row, tokens in enumerate(encoded):
            # Reserve the last slot for EOS so a truncated prompt is still terminated.
            framed = [*tokens[: self.text_len - 1], self.eos_id]
            ids[row, : len(framed)] = torch.tensor(framed, dtype=torch.long)
            mask[row, : len(framed)] = 1
        return ids, mask


class ByteTokenizer(TextTokenizer):
    """UTF-8 byte vocabulary: 0 = pad, 1 = eos, 2 = unk, 3..258 = bytes 0..255.

    Lets small presets run end to end without shipping the 16 MB umT5 tokenizer file. `unk` is never
    produced (every byte has an id) but keeps the special-token layout identical to umT5's.
    """

    PAD_ID = 0
    EOS_ID = 1
    UNK_ID = 2
    BYTE_OFFSET = 3
    VOCAB_SIZE = BYTE_OFFSET + 256

    def __init__(self, text_len: int) -> None:
        super().__init__(text_len, eos_id=self.EOS_ID, pad_id=self.PAD_ID)

    @property
    def vocab_size(self) -> int:
        return self.VOCAB_SIZE

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[b + self.BYTE_OFFSET for b in text.encode("utf-8")] for text in texts]


class UMT5Tokenizer(TextTokenizer):
    """The umT5-xxl SentencePiece vocabulary from a Hugging Face `tokenizer.json`."""

    EOS_TOKEN = "</s>"
    PAD_TOKEN = "<pad>"

    def __init__(self, path: Path, text_len: int) -> None:
        # Imported lazily so the byte tokenizer works where `tokenizers` is not installed.
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        # Framing (EOS, truncation, padding) is done once in the base class, so any settings baked
        # into the file must not apply a second time.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        eos_id = tokenizer.token_to_id(self.EOS_TOKEN)
        if eos_id is None:
            raise ValueError(f"{path}: tokenizer has no {self.EOS_TOKEN!r} token")
        pad_id = tokenizer.token_to_id(self.PAD_TOKEN)
        super().__init__(text_len, eos_id=eos_id, pad_id=0 if pad_id is None else pad_id)
        self._tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        # add_special_tokens=False bypasses the file's post-processor (umT5's appends `</s>`), so EOS
        # is added exactly once, by the base class.
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]


def load_tokenizer(config: T5Config, checkpoint_dir: Path | None) -> TextTokenizer:
    """The tokenizer named by `config.tokenizer`.

    "umt5" reads `<checkpoint_dir>/google/umt5-xxl/tokenizer.json`, or `<checkpoint_dir>/tokenizer/tokenizer.json`
    in the diffusers layout (checkpoint_files.py); "bytes" needs no file.
    """
    if config.tokenizer == "bytes":
        if config.vocab_size < ByteTokenizer.VOCAB_SIZE:
            raise ValueError(f"byte tokenizer needs vocab_size >= {ByteTokenizer.VOCAB_SIZE}, got {config.vocab_size}")
        return ByteTokenizer(config.text_len)
    if config.tokenizer == "umt5":
        if checkpoint_dir is None:
            raise FileNotFoundError(
                f"the umt5 tokenizer needs a checkpoint directory containing {UMT5_TOKENIZER_RELPATH} "
                "(tokenizer/tokenizer.json in the diffusers layout)"
            )
        path = tokenizer_path(Path(checkpoint_dir))
        if not path.is_file():
            raise FileNotFoundError(f"umt5 tokenizer file not found: expected {path}")
        return UMT5Tokenizer(path, config.text_len)
    raise ValueError(f"unknown tokenizer {config.tokenizer!r}")
