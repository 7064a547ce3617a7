"""Text to token ids and back, as the artifact's tokenizer section says (twostep.artifact.tokenizer); the C++
library (cpp/src/model.cpp) does the same, step by step.

The seeds' models use one SentencePiece model whose ids are the model's (pad 0, unk 1, bos 2, eos 3 when
twostep trains it): source sentences end with eos, target sequences start from bos and end at eos. Pretrained
families map SentencePiece's pieces to their own ids through vocabulary tables, put language tokens before the
source, and force one after the decoder's start id.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import sentencepiece as spm

from twostep.artifact.tokenizer import TokenizerSpec
from twostep.errors import BadArtifact, BadInput

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPIECE_UNDERLINE = "\u2581"
WHITESPACE = " \t\n\r\f\v"  # what a stretch of text may end in for spec.trailing_space (as the C++ library's)
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback piece: one byte of a character no piece holds
# How a glossary's target term may stand in a translation, for target_variants: first, after a space, attached to
# what comes before it (an opening bracket, an elision's apostrophe, a script written without spaces).
CONTEXTS = ("", "a ", "(", "'")
MAX_HOLDERS = 512  # target pieces that hold a term whole, beyond which none count (target_variants)


def load_sentencepiece(path: Path) -> spm.SentencePieceProcessor:
    if not path.is_file():
        raise BadArtifact(f"{path}: tokenizer file not found")
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(path.read_bytes())
    except RuntimeError as exc:  # sentencepiece reports a bad file as RuntimeError
        raise BadArtifact(f"{path}: not a SentencePiece model ({exc})") from None
    return sp


def load_table(path: Path) -> dict[str, int]:
    """A {piece: id} vocabulary table (JSON)."""
    if not path.is_file():
        raise BadArtifact(f"{path}: vocabulary file not found")
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadArtifact(f"{path}: not a JSON vocabulary ({exc})") from None
    if not isinstance(table, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in table.values()):
        raise BadArtifact(f"{path}: expected a JSON object of piece -> integer id")
    return table


def load_tokenizers_file(path: Path):
    """A Hugging Face tokenizer.json, through the tokenizers library."""
    from tokenizers import Tokenizer as HFTokenizer

    if not path.is_file():
        raise BadArtifact(f"{path}: tokenizer file not found")
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception for a malformed file
        raise BadArtifact(f"{path}: not a tokenizers file ({str(exc).splitlines()[0]})") from None


class Tokenizer:
    """One artifact's (or checkpoint's) tokenizer: `directory` holds the files `spec` names."""

    def __init__(self, directory: Path | str, spec: TokenizerSpec):
        directory = Path(directory)
        self.spec = spec
        self.source_sp = load_sentencepiece(directory / spec.source_model)
        self.target_sp = (self.source_sp if spec.target_model == spec.source_model
                          else load_sentencepiece(directory / spec.target_model))
        self.source_table = load_table(directory / spec.source_vocab) if spec.source_vocab else None
        self.target_pieces = None  # id -> piece
        if spec.target_vocab:
            table = (self.source_table if spec.target_vocab == spec.source_vocab
                     else load_table(directory / spec.target_vocab))
            self.target_pieces = {i: piece for piece, i in table.items()}
        self.drop = frozenset(spec.drop_ids)
        self.source_pieces: dict[int, str] | None = None  # id -> piece of source_table, made when first needed
        self.special_ids = {p: self.piece_id(p) for p in spec.special_pieces}
        # longest first, so that at each position the longest special piece that matches wins
        ordered = sorted(spec.special_pieces, key=len, reverse=True)
        self.splitter = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @staticmethod
    def load(directory: Path | str, spec: TokenizerSpec) -> Tokenizer:
        """The tokenizer of the spec's kind: SentencePiece (this class), a tokenizer.json (JsonTokenizer), or Moses
        and BPE codes (MosesBPETokenizer)."""
        kinds = {"tokenizers": JsonTokenizer, "moses-bpe": MosesBPETokenizer}
        return kinds.get(spec.kind, Tokenizer)(directory, spec)

    @classmethod
    def sentencepiece(cls, path: Path | str, pad: int = PAD_ID, unk: int = UNK_ID, bos: int = BOS_ID,
                      eos: int = EOS_ID) -> Tokenizer:
        """One SentencePiece file whose ids are the model's (the seeds)."""
        path = Path(path)
        return cls(path.parent, TokenizerSpec.sentencepiece(path.name, pad, unk, bos, eos))

    @property
    def vocab_size(self) -> int:
        return self.source_sp.get_piece_size()

    def piece_id(self, piece: str) -> int:
        if self.source_table is None:
            return self.source_sp.piece_to_id(piece)
        return self.source_table.get(piece, self.spec.unk_id)

    def pieces(self, text: str) -> list[int]:
        """The text's ids: special pieces as one id each, the text between them through SentencePiece."""
        return [i for i, _ in self.tokens(text)]

    def tokens(self, text: str) -> list[tuple[int, str]]:
        """The text's ids with the piece each one is (an unknown piece's own text, where its id is unk's)."""
        out: list[tuple[int, str]] = []
        start = 0
        for m in self.splitter.finditer(text) if self.splitter is not None else ():
            out += self.chunk_tokens(text[start : m.start()])
            out.append((self.special_ids[m.group()], m.group()))
            start = m.end()
        return out + self.chunk_tokens(text[start:])

    def chunk_tokens(self, chunk: str) -> list[tuple[int, str]]:
        """Text without special pieces, through the source SentencePiece model (and the source table)."""
        if not chunk:
            return []
        pieces = self.source_sp.encode(chunk, out_type=str)
        if self.source_table is None:  # SentencePiece's own ids: an unknown piece's text is unk's
            out = list(zip(self.source_sp.piece_to_id(pieces), pieces))
        else:
            out = [(self.source_table.get(p, self.spec.unk_id), p) for p in pieces]
        if chunk[-1] in WHITESPACE:
            out += [(i, SPIECE_UNDERLINE) for i in self.spec.trailing_space]
        return out

    def encode_source(self, text: str, src_lang: str | None = None, tgt_lang: str | None = None) -> list[int]:
        return self.source_tokens(text, src_lang, tgt_lang)[0]

    def source_tokens(self, text: str, src_lang: str | None = None,
                      tgt_lang: str | None = None) -> tuple[list[int], list[str | None]]:
        """encode_source's ids, and the piece of the text each is (None: a language token or the suffix)."""
        if not text.strip():
            raise BadInput("empty input sentence")
        langs = self.spec.languages
        src, tgt = langs.pick("source", src_lang), langs.pick("target", tgt_lang)
        prefix = [*(langs.source[src] if src else ()), *(langs.target[tgt].source if tgt else ())]
        tokens = self.tokens(text)
        suffix = list(self.spec.source_suffix)
        return ([*prefix, *(i for i, _ in tokens), *suffix],
                [*([None] * len(prefix)), *(piece for _, piece in tokens), *([None] * len(suffix))])

    def check_languages(self, src_lang: str | None, tgt_lang: str | None) -> None:
        self.spec.languages.pick("source", src_lang)
        self.spec.languages.pick("target", tgt_lang)

    def encode_target(self, text: str) -> list[int]:
        """Target pieces without bos/eos (training)."""
        return self.target_sp.encode(text) if self.target_pieces is None else self.pieces(text)

    def target_variants(self, term: str) -> list[tuple[int, ...]]:
        """Every tokenization the target text `term` takes in a translation, as target ids: its pieces where it
        follows each of CONTEXTS on a piece boundary, then each single piece that holds it whole (a compound's:
        "▁siebenhundert" holds "sieben"), unless more than MAX_HOLDERS do (a term that short says nothing). One
        that holds unk's id is left out (the model cannot write it)."""
        out: dict[tuple[int, ...], None] = {}
        for context in CONTEXTS:
            spans = self.target_spans(context + term)
            cut = len(context.rstrip())
            if any(begin < cut < end for _, begin, end in spans):
                continue  # the term's first piece joins the context's last
            ids = tuple(i for i, begin, _ in spans if begin >= cut)
            if ids and self.spec.unk_id not in ids:
                out[ids] = None
        holders = [i for i, text in self.target_texts() if term in text]
        if len(holders) <= MAX_HOLDERS:
            out.update(((i,), None) for i in holders if i != self.spec.unk_id)
        return list(out)

    def target_texts(self) -> list[tuple[int, str]]:
        """(id, text) of every ordinary target piece, its word-start mark a space (made once)."""
        if getattr(self, "_target_texts", None) is None:
            if self.target_pieces is not None:
                pieces = self.target_pieces.items()
            else:
                sp = self.target_sp
                pieces = [(i, sp.id_to_piece(i)) for i in range(sp.get_piece_size())
                          if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))]
            self._target_texts = [(i, p.replace(SPIECE_UNDERLINE, " ")) for i, p in pieces]
        return self._target_texts

    def target_spans(self, text: str) -> list[tuple[int, int, int]]:
        """(target id, begin, end) of each piece of `text` through the target model, begin and end its span in
        the text (a piece's leading whitespace included)."""
        pieces = self.target_sp.encode(text, return_type="proto").pieces
        if self.target_pieces is None:
            return [(p.id, p.begin, p.end) for p in pieces]
        ids = self.target_ids()
        return [(ids.get(p.piece, self.spec.unk_id), p.begin, p.end) for p in pieces]

    def target_ids(self) -> dict[str, int]:
        """The target table: piece -> id."""
        if getattr(self, "_target_ids", None) is None:
            self._target_ids = {piece: i for i, piece in self.target_pieces.items()}
        return self._target_ids

    def source_piece(self, token: int) -> str | None:
        """The piece of a source id (None outside the source vocabulary)."""
        if self.source_table is None:
            return self.source_sp.id_to_piece(token) if 0 <= token < self.source_sp.get_piece_size() else None
        if self.source_pieces is None:
            self.source_pieces = {i: piece for piece, i in self.source_table.items()}
        return self.source_pieces.get(token)

    def decode(self, ids: Iterable[int], replacements: Mapping[int, str] | None = None) -> str:
        """Target ids as text; `replacements`: pieces that stand instead of the ids at those indices (unknowns
        replaced: Hypothesis.replacements)."""
        if replacements:
            pieces = [replacements[k] if k in replacements else self.target_piece(i)
                      for k, i in enumerate(map(int, ids)) if k in replacements or i not in self.drop]
            return self.join([p for p in pieces if p is not None])
        kept = [i for i in map(int, ids) if i not in self.drop]
        if self.target_pieces is None:
            size = self.target_sp.get_piece_size()
            pieces = self.target_sp.id_to_piece([i for i in kept if 0 <= i < size])  # one call for all
        else:
            pieces = [self.target_pieces[i] for i in kept if i in self.target_pieces]
        return self.join(pieces)

    def join(self, pieces: list[str]) -> str:
        """Target pieces as text, as the spec's `detokenize` says."""
        text = self.target_sp.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ")
        if self.spec.detokenize == "argos":  # argostranslate's SentencePieceTokenizer.decode, then its lstrip of one
            text = text.replace("_", " ")
            return text[1:] if text.startswith(" ") else text
        return text.strip()

    def target_piece(self, token: int) -> str | None:
        """The piece of a target id (None for an id decode leaves out)."""
        if self.target_pieces is not None:
            return self.target_pieces.get(token)
        return self.target_sp.id_to_piece(token) if 0 <= token < self.target_sp.get_piece_size() else None

    def is_byte(self, token: int) -> bool:
        """Whether a target id is a byte-fallback piece (<0xE3>): its text depends on the bytes around it."""
        piece = self.target_piece(token)
        return piece is not None and BYTE_PIECE.fullmatch(piece) is not None


class JsonTokenizer(Tokenizer):
    """A tokenizer.json (spec.kind "tokenizers"), run by the tokenizers library as transformers runs it: its own
    ids, its added tokens (language codes typed in the text) found by it; languages and the source suffix as the
    spec says."""

    def __init__(self, directory: Path | str, spec: TokenizerSpec):
        self.spec = spec
        self.hf = load_tokenizers_file(Path(directory) / spec.source_model)
        self.drop = frozenset(spec.drop_ids)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def piece_id(self, piece: str) -> int:
        found = self.hf.token_to_id(piece)
        return self.spec.unk_id if found is None else found

    def pieces(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def tokens(self, text: str) -> list[tuple[int, str]]:
        encoding = self.hf.encode(text, add_special_tokens=False)
        return list(zip(encoding.ids, encoding.tokens))

    def source_piece(self, token: int) -> str | None:
        return self.hf.id_to_token(token)

    def target_spans(self, text: str) -> list[tuple[int, int, int]]:
        encoding = self.hf.encode(text, add_special_tokens=False)
        return [(i, begin, end) for i, (begin, end) in zip(encoding.ids, encoding.offsets)]

    def target_texts(self) -> list[tuple[int, str]]:
        if getattr(self, "_target_texts", None) is None:
            special = set(self.hf.get_added_tokens_decoder())  # added tokens (language codes): id -> token
            self._target_texts = [(i, p.replace(SPIECE_UNDERLINE, " ")) for p, i in self.hf.get_vocab().items()
                                  if i not in special]
        return self._target_texts

    def encode_target(self, text: str) -> list[int]:
        return self.pieces(text)

    def decode(self, ids: Iterable[int], replacements: Mapping[int, str] | None = None) -> str:
        return self.hf.decode([int(i) for i in ids if int(i) not in self.drop], skip_special_tokens=True).strip()

    def target_piece(self, token: int) -> str | None:
        return self.hf.id_to_token(token)


class MosesBPETokenizer(Tokenizer):
    """Moses tokenization (sacremoses: punctuation normalized, then tokenized with its escapes, as Moses' scripts
    do) and subword-nmt's BPE codes (spec.source_model), pieces ending in "@@" joined to the next; target pieces
    "@@ "-joined and Moses-detokenized. The models of OPUS-MT trained before SentencePiece, as argostranslate's
    BPETokenizer runs them; the vocabulary tables give the ids."""

    SEPARATOR = "@@"

    def __init__(self, directory: Path | str, spec: TokenizerSpec):
        from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        directory = Path(directory)
        if spec.source_vocab is None or spec.target_vocab is None or spec.moses is None:
            raise BadArtifact(f"{directory}: a moses-bpe tokenizer needs source_vocab, target_vocab and moses")
        path = directory / spec.source_model
        if not path.is_file():
            raise BadArtifact(f"{path}: tokenizer file not found")
        try:
            with path.open(encoding="utf-8") as codes:
                self.bpe = BPE(codes, separator=self.SEPARATOR)
        except (UnicodeDecodeError, ValueError, SystemExit) as exc:  # subword-nmt exits on a malformed line
            raise BadArtifact(f"{path}: not a BPE codes file ({exc})") from None
        source, target = spec.moses
        self.normalizer, self.moses = MosesPunctNormalizer(source), MosesTokenizer(source)
        self.detokenizer = MosesDetokenizer(target)
        self.spec = spec
        self.source_table = load_table(directory / spec.source_vocab)
        target_table = (self.source_table if spec.target_vocab == spec.source_vocab
                        else load_table(directory / spec.target_vocab))
        self.target_pieces = {i: piece for piece, i in target_table.items()}
        self.drop = frozenset(spec.drop_ids)
        self.source_pieces = None
        self.special_ids = {p: self.piece_id(p) for p in spec.special_pieces}
        ordered = sorted(spec.special_pieces, key=len, reverse=True)
        self.splitter = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @property
    def vocab_size(self) -> int:
        return max(self.source_table.values(), default=-1) + 1

    def chunk_tokens(self, chunk: str) -> list[tuple[int, str]]:
        if not chunk.strip():
            return []
        words = " ".join(self.moses.tokenize(self.normalizer.normalize(chunk))).strip("\r\n ").split(" ")
        return [(self.source_table.get(p, self.spec.unk_id), p) for p in self.bpe.segment_tokens(words)]

    def encode_target(self, text: str) -> list[int]:
        return self.pieces(text)

    def target_variants(self, term: str) -> list[tuple[int, ...]]:
        """The one tokenization Moses and BPE give a target term (each word apart, whatever precedes it), then each
        piece that holds it whole (Tokenizer.target_variants)."""
        from sacremoses import MosesTokenizer

        if getattr(self, "target_moses", None) is None:
            self.target_moses = MosesTokenizer(self.spec.moses[1])
        words = " ".join(self.target_moses.tokenize(self.normalizer.normalize(term))).strip("\r\n ").split(" ")
        ids = tuple(self.target_ids().get(p, self.spec.unk_id) for p in self.bpe.segment_tokens(words) if p)
        out = [ids] if ids and self.spec.unk_id not in ids else []
        holders = [(i,) for i, p in self.target_pieces.items() if term in p.removesuffix(self.SEPARATOR)]
        return out + [h for h in holders if h not in out] if len(holders) <= MAX_HOLDERS else out

    def join(self, pieces: list[str]) -> str:
        words = " ".join(pieces).replace(self.SEPARATOR + " ", "").split(" ")
        text = self.detokenizer.detokenize(words)
        if self.spec.detokenize == "argos":  # argostranslate's lstrip of one space
            return text[1:] if text.startswith(" ") else text
        return text.strip()


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
