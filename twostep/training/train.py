"""Training, the seeds' recipe (Annotated Transformer): padding and subsequent masks, label smoothing,
the Noam schedule with Adam (0.9, 0.98, eps 1e-9), batches of similar lengths, periodic evaluation and
resumable state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from twostep.errors import OutputError
from twostep.files import output_directory
from twostep.model.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint, write_checkpoint
from twostep.model.config import preset
from twostep.model.tasks import get_task
from twostep.model.transformer import Transformer
from twostep.runtime.tokenizer import Tokenizer, train_tokenizer
from twostep.training.evaluate import Scores, checkpoint_translator, evaluate

Example = tuple[list[int], list[int]]  # source ids (ending with eos), target ids (without bos/eos)


@dataclass(frozen=True)
class TrainConfig:
    task: str = "numbers-en-de"
    preset: str = "demo"
    vocab_size: int = 256
    steps: int = 2400
    max_tokens: int = 3000  # target tokens per batch, padding included
    warmup: int = 400
    lr_factor: float = 0.8
    label_smoothing: float = 0.1
    dropout: float = 0.1
    eval_every: int = 300
    eval_sentences: int = 300
    seed: int = 1
    threads: int = 2


def label_smoothing_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float) -> torch.Tensor:
    """The seeds' LabelSmoothing: KL to a distribution with `smoothing` spread over all but pad and the target."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    true = torch.full_like(logp, smoothing / (logp.size(-1) - 2))
    true.scatter_(1, target[:, None], 1.0 - smoothing)
    true[:, pad_id] = 0
    true[target == pad_id] = 0
    return F.kl_div(logp, true, reduction="sum")


def length_batches(examples: list[Example], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length so little padding is wasted; batch order shuffled."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][1]), len(examples[i][0]), rng.random()))
    batches, current, width = [], [], 0
    for i in order:
        w = max(width, len(examples[i][1]) + 1, len(examples[i][0]))
        if current and w * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, w = [], max(len(examples[i][1]) + 1, len(examples[i][0]))
        current.append(i)
        width = w
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(examples: list[Example], pad_id: int, bos_id: int, eos_id: int) -> tuple[torch.Tensor, ...]:
    src_w = max(len(s) for s, _ in examples)
    tgt_w = max(len(t) for _, t in examples) + 1
    src = torch.full((len(examples), src_w), pad_id, dtype=torch.long)
    tgt_in = torch.full((len(examples), tgt_w), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(examples), tgt_w), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(examples):
        src[row, : len(s)] = torch.tensor(s)
        tgt_in[row, : len(t) + 1] = torch.tensor([bos_id] + t)
        tgt_out[row, : len(t) + 1] = torch.tensor(t + [eos_id])
    return src, (src != pad_id).long(), tgt_in, tgt_out


def noam(step: int, d_model: int, factor: float, warmup: int) -> float:
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


STATE_ENTRIES = {"tokenizer.model", "model", "optimizer.pt", "state.json"}  # what OUT.train/ holds


def prepare_state_dir(state_dir: Path, resume: bool, force: bool) -> None:
    """OUT.train/ keeps the resumable state. Only twostep's own state is used or replaced there, and an
    earlier run's state is neither resumed nor discarded unless the user says which."""
    if state_dir.is_symlink() or (state_dir.exists() and not state_dir.is_dir()):
        raise OutputError(f"{state_dir} is where training keeps its resumable state, and it is a file or a link; "
                          "move it away or choose another --out")
    if not state_dir.exists():
        return
    entries = os.listdir(state_dir)
    strays = sorted(e for e in entries if e not in STATE_ENTRIES and not e.startswith(".model.twostep-"))
    if strays:
        raise OutputError(f"{state_dir} holds files twostep did not write ({', '.join(strays[:5])}); training "
                          "keeps its resumable state there: move them out or choose another --out")
    if entries and not resume:
        if not force:
            raise OutputError(f"{state_dir}: an earlier run left its resumable state there; pass --resume to "
                              "continue it, or --force to start over")
        shutil.rmtree(state_dir)


def train(cfg: TrainConfig, out_dir: Path, resume: bool = False, force: bool = False, command: str | None = None,
          log=print) -> Scores:
    """Train, then write the checkpoint at `out_dir` (replacing an earlier checkpoint only with `force`).
    The output is checked and locked before training starts, so a wrong --out fails at once."""
    out_dir = Path(out_dir)
    state_dir = out_dir.with_name(out_dir.name + ".train")
    with output_directory(out_dir, CHECKPOINT, force) as final:
        prepare_state_dir(state_dir, resume, force)
        model, scores, info = run_training(cfg, state_dir, resume, command, log)
        write_checkpoint(model.eval(), final, tokenizer=state_dir / "tokenizer.model", task=cfg.task, info=info)
    shutil.rmtree(state_dir)
    return scores


def run_training(cfg: TrainConfig, state_dir: Path, resume: bool, command: str | None,
                 log) -> tuple[Transformer, Scores, dict]:
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task = get_task(cfg.task)
    pairs = task.split("train")
    state_dir.mkdir(parents=True, exist_ok=True)
    tok_path = state_dir / "tokenizer.model"
    if not (resume and tok_path.exists()):
        train_tokenizer([s for pair in pairs for s in pair], tok_path, cfg.vocab_size)
    tokenizer = Tokenizer.sentencepiece(tok_path)
    examples = [(tokenizer.encode_source(s), tokenizer.encode_target(t)) for s, t in pairs]

    vocab = tokenizer.vocab_size
    config = preset(cfg.preset, vocab, vocab, dropout=cfg.dropout, share_embeddings=True, tie_generator=True)
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    step, elapsed, rng = 0, 0.0, random.Random(cfg.seed)
    if resume and (state_dir / "state.json").exists():
        state = json.loads((state_dir / "state.json").read_text())
        model = load_checkpoint(state_dir / "model").model
        optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
        optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
        step, elapsed = state["step"], state["elapsed"]
        rng.setstate((3, tuple(state["rng"][1]), None))
        log(f"resumed at step {step}")

    def save_state() -> None:
        save_checkpoint(model, state_dir / "model", tokenizer=tok_path, task=cfg.task, force=True)
        torch.save(optimizer.state_dict(), state_dir / "optimizer.pt")
        state = {"step": step, "elapsed": elapsed, "rng": list(rng.getstate()[:2]), "config": asdict(cfg)}
        (state_dir / "state.json").write_text(json.dumps(state))

    def dev_scores() -> Scores:
        model.eval()
        ckpt = load_checkpoint(save_checkpoint(model, state_dir / "model", tokenizer=tok_path, task=cfg.task,
                                               force=True))
        scores = evaluate(checkpoint_translator(ckpt), cfg.task, "dev", limit=cfg.eval_sentences)
        model.train()
        return scores

    log(f"model: {config.d_model}d, {config.n_encoder_layers}+{config.n_decoder_layers} layers, "
        f"{model.num_parameters():,} parameters; {len(examples):,} training pairs; vocab {vocab}")
    model.train()
    columns = (
        TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TextColumn("dev EM {task.fields[em]}"), TimeElapsedColumn(), TimeRemainingColumn(),
    )
    batches: list[list[int]] = []
    scores = None
    started = time.perf_counter() - elapsed
    with Progress(*columns) as progress:
        bar = progress.add_task("train", total=cfg.steps, completed=step, loss=float("nan"), tps=0.0, em="-")
        window_tokens, window_start = 0, time.perf_counter()
        while step < cfg.steps:
            if not batches:
                batches = length_batches(examples, cfg.max_tokens, rng)
            src, src_mask, tgt_in, tgt_out = collate([examples[i] for i in batches.pop()], config.pad_id,
                                                     config.bos_id, config.eos_id)
            step += 1
            for group in optimizer.param_groups:
                group["lr"] = noam(step, config.d_model, cfg.lr_factor, cfg.warmup)
            logits = model(src, src_mask, tgt_in)
            n_tokens = int((tgt_out != config.pad_id).sum())
            loss = label_smoothing_loss(logits.flatten(0, 1), tgt_out.flatten(), config.pad_id,
                                        cfg.label_smoothing) / n_tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

            window_tokens += n_tokens
            tps = window_tokens / max(time.perf_counter() - window_start, 1e-9)
            progress.update(bar, advance=1, loss=loss.item(), tps=tps)
            if step % 50 == 0:
                window_tokens, window_start = 0, time.perf_counter()
            if step % cfg.eval_every == 0 or step == cfg.steps:
                scores = dev_scores()
                elapsed = time.perf_counter() - started
                progress.update(bar, em=f"{scores.exact_match:.1f}%")
                log(f"step {step}: loss {loss.item():.3f}, dev exact match {scores.exact_match:.1f}%, "
                    f"chrF {scores.chrf:.1f}, {elapsed:.0f}s")
                save_state()
                window_tokens, window_start = 0, time.perf_counter()
    elapsed = time.perf_counter() - started
    info = {"training": {"command": command, "config": asdict(cfg), "steps": step,
                         "train_seconds": round(elapsed, 1), "dev": scores.to_dict() if scores else None}}
    return model, scores, info
