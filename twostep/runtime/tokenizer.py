"""SentencePiece tokenization, the same file for Python and C++ consumers.

Ids follow the checkpoint's special tokens: pad 0, unk 1, bos 2, eos 3. Source sentences end with eos;
target sequences start from bos and end at eos.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from twostep.errors import BadArtifact, BadInput

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not self.path.is_file():
            raise BadArtifact(f"{self.path}: tokenizer file not found")
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.path.read_bytes())
        except RuntimeError as exc:  # sentencepiece reports a bad file as RuntimeError
            raise BadArtifact(f"{self.path}: not a SentencePiece model ({exc})") from None
        self.special = {
            "pad": self.sp.pad_id(), "unk": self.sp.unk_id(), "bos": self.sp.bos_id(), "eos": self.sp.eos_id()
        }

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode_source(self, text: str) -> list[int]:
        if not text.strip():
            raise BadInput("empty input sentence")
        return self.sp.encode(text) + [self.sp.eos_id()]

    def encode_target(self, text: str) -> list[int]:
        """Target pieces without bos/eos."""
        return self.sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        specials = set(self.special.values())
        return self.sp.decode([int(i) for i in ids if int(i) not in specials])


def train_tokenizer(sentences: Iterable[str], out_path: Path, vocab_size: int, model_type: str = "unigram") -> Path:
    """Train a SentencePiece model on `sentences` and write it to `out_path`."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type=model_type,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    out_path = Path(out_path)
    out_path.write_bytes(model.getvalue())
    return out_path
