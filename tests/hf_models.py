"""Tiny pretrained-family models built by transformers itself, for the parity tests: a Marian model with a
shared vocabulary (and language tokens), one with separate vocabularies, and an M2M100 model, each with its
tokenizer files, saved with `save_pretrained` into a directory. Random weights with a non-zero
final_logits_bias, trained for STEPS steps on a few sentence pairs so that their outputs vary and end at eos
(random weights alone repeat one token); nothing is downloaded. `reference` gives transformers' generate()
tokens and text."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import sentencepiece as spm

SOURCE_TEXT = ["the cat sat on the mat", "a dog ran in the park today", "hello world", "three hundred and forty two",
               "the quick brown fox jumps over the lazy dog", "we sat in the garden all day", "good morning"]
TARGET_TEXT = ["le chat est sur le tapis", "un chien court dans le parc", "bonjour le monde", "trois cent quarante",
               "le renard brun saute par dessus le chien", "nous sommes dans le jardin", "bon matin"]
TEST_SENTENCES = ["the cat sat in the park", "hello dog", "a quick fox", "we ran all day over the mat",
                  "good world today", "three brown cats", "the lazy garden", "zebra xylophone!"]


STD = 0.3
STEPS = 120
EOS_BIAS = 3.0


def train(model, tokenizer, steps: int = STEPS, prefix: str = "", **target_kwargs) -> None:
    """A few hundred Adam steps at most: source text (after `prefix`) -> target text, as transformers computes the
    loss."""
    import torch

    batch = tokenizer([prefix + s for s in SOURCE_TEXT], text_target=TARGET_TEXT, padding=True, return_tensors="pt",
                      **target_kwargs)
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model.eval()


def train_spm(path: Path, sentences: list[str], vocab_size: int, **options) -> Path:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences * 10), model_writer=model, vocab_size=vocab_size,
                                   minloglevel=2, hard_vocab_limit=False, num_threads=1, **options)
    path.write_bytes(model.getvalue())
    return path


def pieces_of(path: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def randomize(model, seed: int, std: float | None = None) -> None:
    """Weights large enough that outputs vary with the input, and a non-zero final_logits_bias where the family
    has one."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, std or STD)
            elif "norm" not in name:
                p.normal_(0, 0.1)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0, 0.5)


def marian_dir(out: Path, separate: bool = False, seed: int = 0, train_steps: int | None = None,
               pair: tuple[str, str] | None = None) -> Path:
    """A Marian model: shared vocabulary with >>fra<</>>deu<< language tokens, or separate vocabularies; `pair`:
    the (source_lang, target_lang) its tokenizer_config.json names (OPUS-MT's en, de), else none."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    work = out / "src"
    work.mkdir(exist_ok=True)
    source = train_spm(work / "source.spm", SOURCE_TEXT, 60)
    target = train_spm(work / "target.spm", TARGET_TEXT if separate else SOURCE_TEXT, 100 if separate else 60)

    def table(spm_file: Path, codes: list[str]) -> dict[str, int]:
        """OPUS-MT's layout: eos, unk, language tokens, the pieces, pad last; with separate vocabularies pad is
        third in both (transformers' config has one pad id for both embeddings)."""
        vocab = {"</s>": 0, "<unk>": 1, **({"<pad>": 2} if separate else {})}
        vocab.update({f">>{c}<<": len(vocab) + i for i, c in enumerate(codes)})
        for piece in pieces_of(spm_file):
            if piece not in vocab and piece not in ("<s>", "</s>", "<unk>"):
                vocab[piece] = len(vocab)
        vocab.setdefault("<pad>", len(vocab))
        return vocab

    vocab = table(source, [] if separate else ["fra", "deu"])
    (work / "vocab.json").write_text(json.dumps(vocab))
    kwargs = {}
    target_vocab = vocab
    if separate:
        target_vocab = table(target, [])
        (work / "target_vocab.json").write_text(json.dumps(target_vocab))
        kwargs = dict(target_vocab_file=str(work / "target_vocab.json"), separate_vocabs=True)
    if pair is not None:
        kwargs.update(source_lang=pair[0], target_lang=pair[1])
    tokenizer = MarianTokenizer(str(source), str(target), str(work / "vocab.json"), **kwargs)
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(target_vocab), d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, activation_function="swish", scale_embedding=True,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=None, share_encoder_decoder_embeddings=not separate, dropout=0.0,
    )
    model = MarianMTModel(config).eval()
    randomize(model, seed, std=0.1)
    train(model, tokenizer, STEPS if train_steps is None else train_steps)
    if separate:  # its character-level target pieces make long sentences: end some of them sooner
        with torch.no_grad():
            model.final_logits_bias[0, 0] += EOS_BIAS
    model.generation_config = GenerationConfig(
        bad_words_ids=[[config.decoder_start_token_id]], decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=0, pad_token_id=config.decoder_start_token_id, forced_eos_token_id=None, max_length=64)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def m2m100_dir(out: Path, seed: int = 0) -> Path:
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    out.mkdir(parents=True, exist_ok=True)
    work = out / "src"
    work.mkdir(exist_ok=True)
    model_file = train_spm(work / "sentencepiece.bpe.model", SOURCE_TEXT + TARGET_TEXT, 80, model_type="bpe")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in pieces_of(model_file):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = M2M100Tokenizer(str(work / "vocab.json"), str(model_file), src_lang="en", tgt_lang="fr")
    config = M2M100Config(
        vocab_size=len(vocab) + 100 + 8,  # + 100 language tokens and 8 "madeup words"
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=None, dropout=0.0,
    )
    model = M2M100ForConditionalGeneration(config).eval()
    randomize(model, seed, std=0.1)
    train(model, tokenizer)
    model.generation_config = GenerationConfig(decoder_start_token_id=2, eos_token_id=2, pad_token_id=1,
                                               bos_token_id=0, forced_eos_token_id=None, max_length=64)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


NLLB_CODES = ["eng_Latn", "fra_Latn", "deu_Latn", "zho_Hant"]
PADDING_ROWS = 3  # NLLB's embedding has rows beyond its tokenizer's ids


def nllb_dir(out: Path, with_spm: bool = True, seed: int = 0, train_steps: int = STEPS) -> Path:
    """An NLLB model (M2M100's architecture with NllbTokenizer) and its tokenizer as the hub's repositories hold it
    (sentencepiece.bpe.model beside tokenizer.json), or, `with_spm` False, as transformers 5 saves it
    (tokenizer.json alone). A few language codes of NLLB's 202; padding rows in the embedding."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    spm_file = bpe_model(out)
    tokenizer = NllbTokenizer.from_pretrained(spm_file.parent, src_lang="eng_Latn", tgt_lang="fra_Latn",
                                              additional_special_tokens=NLLB_CODES)
    config = M2M100Config(vocab_size=len(tokenizer) + PADDING_ROWS, **FAIRSEQ_SIZES, activation_function="relu")
    model = M2M100ForConditionalGeneration(config).eval()
    return finish(model, tokenizer, out, spm_file if with_spm else None, seed, train_steps)


def mbart50_dir(out: Path, with_spm: bool = True, seed: int = 0, train_steps: int = STEPS) -> Path:
    """An mBART-50 model (MBartForConditionalGeneration with MBart50Tokenizer's 52 language codes): learned
    positions, embedding norms, gelu, a final_logits_bias."""
    from transformers import MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

    spm_file = bpe_model(out, "unigram")
    tokenizer = MBart50Tokenizer.from_pretrained(spm_file.parent, src_lang="en_XX", tgt_lang="fr_XX")
    config = MBartConfig(vocab_size=len(tokenizer), **FAIRSEQ_SIZES, activation_function="gelu")
    model = MBartForConditionalGeneration(config).eval()
    return finish(model, tokenizer, out, spm_file if with_spm else None, seed, train_steps)


def mbart50_hub_layout(model_dir: Path, out: Path) -> Path:
    """A copy of an mBART-50 directory (mbart50_dir's) in the layout of the hub's facebook/mbart-large-50-many-to-
    many-mmt and of transformers 4's slow MBart50Tokenizer.save_pretrained: sentencepiece.bpe.model,
    tokenizer_config.json, special_tokens_map.json and no tokenizer.json. The installed transformers (5.x) saves
    tokenizer.json and no special_tokens_map.json: the copy leaves out the one and writes the other as 4.x did."""
    from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES

    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("tokenizer.json", "src"))
    mask = {"content": "<mask>", "lstrip": True, "normalized": True, "rstrip": False, "single_word": False}
    (out / "special_tokens_map.json").write_text(json.dumps({
        "additional_special_tokens": FAIRSEQ_LANGUAGE_CODES, "bos_token": "<s>", "cls_token": "<s>",
        "eos_token": "</s>", "mask_token": mask, "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>"}))
    return out


FAIRSEQ_SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                     scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                     forced_eos_token_id=None, dropout=0.0)


def bpe_model(out: Path, model_type: str = "bpe") -> Path:
    """The SentencePiece model of NLLB and mBART (both name it sentencepiece.bpe.model; mBART's is a unigram)."""
    work = out / "src"
    work.mkdir(parents=True, exist_ok=True)
    return train_spm(work / "sentencepiece.bpe.model", SOURCE_TEXT + TARGET_TEXT, 80, model_type=model_type)


def finish(model, tokenizer, out: Path, spm_file: Path | None, seed: int, train_steps: int) -> Path:
    """Randomize, train and save a model whose target language is forced after the decoder's start."""
    from transformers import GenerationConfig

    randomize(model, seed, std=0.1)
    train(model, tokenizer, train_steps)
    model.generation_config = GenerationConfig(decoder_start_token_id=2, eos_token_id=2, pad_token_id=1,
                                               bos_token_id=0, forced_eos_token_id=None, max_length=64)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if spm_file is not None:
        shutil.copy(spm_file, out / "sentencepiece.bpe.model")
    return out


def reference(model_dir: Path, texts: list[str], max_new_tokens: int | None, beams: int | None = 1,
              src_lang: str | None = None, tgt_lang: str | None = None,
              ) -> tuple[list[list[int]], list[str], list[float] | None]:
    """transformers' generate() (greedy, or beam search with `beams`) one sentence at a time: the generated ids
    (without the start token, a forced language token and eos), the decoded text and, for beam search, the
    best hypothesis' `sequences_scores` (its log-probability divided by its length ** length_penalty).
    `max_new_tokens` or `beams` None: the model's generation config's."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    kwargs = {}
    marian = type(tokenizer).__name__.startswith("Marian")
    madlad = type(tokenizer).__name__.startswith("T5")  # a T5 with languages is MADLAD-shaped: <2xx> before the text
    if src_lang:
        tokenizer.src_lang = src_lang
    if tgt_lang and not (marian or madlad):
        kwargs["forced_bos_token_id"] = (tokenizer.get_lang_id(tgt_lang) if hasattr(tokenizer, "get_lang_id")
                                         else tokenizer.convert_tokens_to_ids(tgt_lang))
    settings = {k: v for k, v in (("max_new_tokens", max_new_tokens), ("num_beams", beams)) if v is not None}
    tokens, texts_out, scores = [], [], []
    for text in texts:
        if tgt_lang and marian:
            text = f">>{tgt_lang}<< {text}"
        if tgt_lang and madlad:
            text = f"<2{tgt_lang}> {text}"
        batch = tokenizer([text], return_tensors="pt")
        with torch.no_grad():
            result = model.generate(**batch, **settings, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True, **kwargs)
        out = result.sequences[0].tolist()
        if getattr(result, "sequences_scores", None) is not None:  # beam search
            scores.append(float(result.sequences_scores[0]))
        # transformers 5's M2M100Tokenizer keeps language tokens in decoded text even with skip_special_tokens
        # (4.x dropped them, as twostep does): the text is that of the tokens after the forced language token.
        out = out[1 + bool(kwargs):]  # the start token, the forced language token
        # twostep strips the surrounding whitespace that NLLB's and mBART's tokenizers keep where a "▁" piece
        # begins or ends the output
        texts_out.append(tokenizer.decode(out, skip_special_tokens=True).strip())
        if model.generation_config.eos_token_id in out:
            out = out[: out.index(model.generation_config.eos_token_id)]
        tokens.append(out)
    return tokens, texts_out, scores or None


def zero_start_embedding(model_dir: Path) -> Path:
    """Zero the embedding row of a Marian model's decoder start token (pad), in place. CTranslate2's Marian
    conversion starts the decoder from a zero embedding (`start_from_zero_embedding`) whatever that row holds,
    as OPUS-MT models' zero row gives; marian_dir's random row would not. transformers and CTranslate2 then
    decode the same model."""
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        model.get_decoder().embed_tokens.weight[model.config.decoder_start_token_id].zero_()
    model.save_pretrained(model_dir)
    return model_dir


T5_SIZES = dict(d_model=32, d_kv=16, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
MADLAD_CODES = ["en", "fr", "de", "zh_Latn"]


def t5_dir(out: Path, madlad: bool = False, seed: int = 0, train_steps: int = STEPS) -> Path:
    """A T5 v1.1-shaped model (gated-gelu, an output layer of its own; T5ForConditionalGeneration) with its
    SentencePiece model in the hub's layout (spiece.model beside the tokenizer.json transformers 5 saves), or,
    `madlad`, MADLAD-400's shape: `<2xx>` target-language pieces in the vocabulary, put before the source text. Heads
    of 16 (4 x 16 = 64 against d_model 32, as MADLAD's 16 x 128 against 1024), 8 relative buckets up to a distance of
    20, so that sentences of NEW_TOKENS reach the logarithmic and the last buckets; T5's padding rows in the
    embedding; a few extra ids (sentinels) in T5's."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer, spm_file = t5_tokenizer(out, madlad)
    config = T5Config(vocab_size=len(tokenizer) + PADDING_ROWS, feed_forward_proj="gated-gelu",
                      tie_word_embeddings=False, **T5_SIZES)
    model = T5ForConditionalGeneration(config).eval()
    randomize(model, seed, std=0.1)
    # transformers 5 ties T5's output layer to the embedding whatever the config says, unless the weights hold one
    # of their own (mT5's and MADLAD's checkpoints do): give it its own
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach() * 2)
    train(model, tokenizer, train_steps, prefix="<2fr> " if madlad else "")
    return save_t5(model, tokenizer, spm_file, out)


# transformers' T5 init gives logit rows of rms sqrt(d_model): a width at which the fixed fp32 tolerance (atol 1e-4
# + rtol 1e-4) refused a dozen logits of a correct graph (docs/guarantees.md, "The parity tolerance"), everything
# else as small as T5 allows
T5_INIT_SIZES = {**T5_SIZES, "d_model": 16384, "d_kv": 8, "num_heads": 1, "d_ff": 8, "num_layers": 1,
                 "num_decoder_layers": 1}


def t5_init_dir(out: Path, vocab_size: int = 128, seed: int = 0) -> Path:
    """A T5 v1.1-shaped model at T5_INIT_SIZES as transformers initializes it, untrained (T5PreTrainedModel.
    _init_weights: the embedding and an output layer of its own of std 1, the projections of std 1 / sqrt(fan-in),
    the queries' a further 1 / sqrt(d_kv)); t5_dir's tokenizer, the embedding padded to `vocab_size` rows."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer, spm_file = t5_tokenizer(out)
    config = T5Config(vocab_size=vocab_size, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      **T5_INIT_SIZES)
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(config).eval()
    # transformers 5 ties the output layer on construction: an own one, as _init_weights draws it when untied
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * config.initializer_factor)
    return save_t5(model, tokenizer, spm_file, out)


def t5_tokenizer(out: Path, madlad: bool = False):
    """T5Tokenizer over a SentencePiece model trained into out/src (T5's pad 0, eos 1, unk 2, no bos), with 5 extra
    ids, or, `madlad`, MADLAD's <2xx> pieces and none: (tokenizer, its spiece.model)."""
    from transformers import T5Tokenizer

    work = out / "src"
    work.mkdir(parents=True, exist_ok=True)
    symbols = [f"<2{c}>" for c in MADLAD_CODES] if madlad else []
    spm_file = train_spm(work / "spiece.model", SOURCE_TEXT + TARGET_TEXT, 80, model_type="unigram", pad_id=0,
                         eos_id=1, unk_id=2, bos_id=-1, user_defined_symbols=symbols)
    return T5Tokenizer.from_pretrained(work, extra_ids=0 if madlad else 5), spm_file


def save_t5(model, tokenizer, spm_file: Path, out: Path) -> Path:
    """save_pretrained, spiece.model beside it, and config.json as the hub's mT5 and MADLAD configs say it."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.copy(spm_file, out / "spiece.model")
    config = json.loads((out / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}, indent=2))
    return out
