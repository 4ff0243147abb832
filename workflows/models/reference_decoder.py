"""The reference decoder: a Llama-geometry model Kiln trains itself, deterministically, on the
reference corpus (``reference_corpus.py``), and caches by the hash of its recipe.

Two recipes share one code path: ``full`` (about 32 M parameters: hidden 512, 8 layers, 8 heads
and 4 key/value heads, SwiGLU 1408, an 8192-token byte-level BPE trained on the corpus' train
split, input and output embeddings *not* tied, so the head is a Linear of its own that the
quantizers can treat apart) and ``tiny`` (hidden 64, 2 layers, a few hundred KB of corpus, for
the tests).

The recipe key hashes this file's and the corpus script's code, the corpus manifest's digest, the
recipe's hyper-parameters and seed, and the versions of torch, transformers and tokenizers. The
first ``build()`` trains (AdamW, warmup then cosine decay, gradient clipping, fp32, fixed seed,
deterministic algorithms, a fixed thread count) and writes a Hugging Face folder with
``recipe.json`` and ``report.json`` (held-out perplexity against an add-one unigram model of the
train split, and the per-channel max/RMS of every Linear layer's input on held-out text) into
``$KILN_REFERENCE_CACHE/models/<key>/`` atomically (temporary folder, then rename); a later call
with the same key returns that folder without training.

    python workflows/models/reference_decoder.py [--recipe full|tiny]   # build or find; print the report
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from reference_corpus import Corpus, CorpusSpec, build_corpus, cache_root

log = logging.getLogger(__name__)
EOS = "<|endoftext|>"
TINY_INCLUDE = ("python-stdlib:email/", "python-stdlib:json/", "python-stdlib:logging/", "python-stdlib:argparse.py")


@dataclass(frozen=True)
class Recipe:
    name: str
    corpus: CorpusSpec = field(default_factory=CorpusSpec)
    vocab: int = 8192
    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 1408
    tie_embeddings: bool = False
    sequence: int = 256
    batch: int = 4  # sequences per step: 1024 tokens
    steps: int = 560
    lr: float = 1.5e-3
    warmup: int = 30
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    threads: int = 2
    eval_windows: int = 256  # held-out windows scored in the report (all when fewer)


RECIPES = {
    "full": Recipe("full"),
    "tiny": Recipe(
        "tiny",
        corpus=CorpusSpec(packages=False, include=TINY_INCLUDE, max_chars=300_000, heldout_per_mille=100),
        vocab=512,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=192,
        sequence=128,
        batch=8,
        steps=120,
        warmup=10,
        lr=3e-3,
        threads=1,
        eval_windows=64,
    ),
}


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def recipe_key(recipe: Recipe, corpus_digest: str) -> str:
    here = Path(__file__).parent
    material = {
        "code": [hashlib.sha256((here / name).read_bytes()).hexdigest() for name in ("reference_decoder.py", "reference_corpus.py")],
        "recipe": asdict(recipe),
        "corpus": corpus_digest,
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def train_tokenizer(texts: list[str], vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS)


def encode(tok: Any, texts: list[str]) -> list[list[int]]:
    """Each document as [eos] + its tokens: the end-of-text token is the separator and the start."""
    return [[tok.eos_token_id, *ids] for ids in tok(texts)["input_ids"]]


def heldout_windows(docs: list[list[int]], sequence: int, limit: int | None = None) -> tuple[list[list[int]], list[int]]:
    """Non-overlapping windows of ``sequence`` tokens per held-out document (the last may be
    shorter, at least 2 tokens), in document order, and each window's document index."""
    windows, groups = [], []
    for index, doc in enumerate(docs):
        for start in range(0, len(doc) - 1, sequence):
            window = doc[start : start + sequence]
            if len(window) >= 2:
                windows.append(window)
                groups.append(index)
    if limit is not None and len(windows) > limit:
        step = len(windows) / limit  # spread over the documents, deterministically
        picked = [int(i * step) for i in range(limit)]
        windows, groups = [windows[i] for i in picked], [groups[i] for i in picked]
    return windows, groups


def _train(recipe: Recipe, tok: Any, stream: Any, folder: Path) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=max(512, recipe.sequence),
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=recipe.tie_embeddings,
    )
    torch.manual_seed(recipe.seed)
    generator = torch.Generator().manual_seed(recipe.seed)
    model = LlamaForCausalLM(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    plain = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": plain, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.95)
    )

    def factor(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return recipe.final_lr_ratio + (1 - recipe.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    started = time.monotonic()
    for step in range(recipe.steps):
        starts = torch.randint(0, len(stream) - recipe.sequence - 1, (recipe.batch,), generator=generator)
        chunk = torch.stack([stream[s : s + recipe.sequence] for s in starts.tolist()]).long()
        loss = model(input_ids=chunk, labels=chunk).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimizer.step()
        schedule.step()
        if step % 10 == 0 or step == recipe.steps - 1:
            elapsed = time.monotonic() - started
            rate = (step + 1) * recipe.batch * recipe.sequence / elapsed
            log.info(
                "step %d/%d loss %.4f lr %.2e %.0f tokens/s %.0f s",
                step + 1,
                recipe.steps,
                loss.item(),
                schedule.get_last_lr()[0],
                rate,
                elapsed,
            )
    model.eval()
    model.generation_config.pad_token_id = tok.eos_token_id
    return model


def evaluate(model: Any, heldout: list[list[int]], train_counts: Any, recipe: Recipe) -> dict[str, Any]:
    """Held-out NLL of the model and of an add-one unigram model of the train split on the same
    tokens; per Linear layer, its input's per-channel max |x| and RMS on the same windows."""
    import torch

    windows, _ = heldout_windows(heldout, recipe.sequence, recipe.eval_windows)
    stats: dict[str, dict[str, Any]] = {}

    def hook(name: str) -> Any:
        def record(_module: Any, inputs: tuple[Any, ...]) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            entry = stats.setdefault(name, {"max": torch.zeros(x.shape[-1], dtype=torch.float64), "sq": 0.0, "n": 0})
            entry["max"] = torch.maximum(entry["max"], x.abs().amax(0))
            entry["sq"] = entry["sq"] + (x * x).sum(0)
            entry["n"] += x.shape[0]

        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    total = count = 0.0
    try:
        with torch.no_grad():
            for window in windows:
                logits = model(torch.tensor([window])).logits[0, :-1].double()
                total += torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum").item()
                count += len(window) - 1
    finally:
        for handle in handles:
            handle.remove()
    counts = train_counts.double() + 1.0
    unigram_logp = torch.log(counts / counts.sum())
    unigram = -sum(unigram_logp[torch.tensor(w[1:])].sum().item() for w in windows) / count
    layers = {}
    for name, entry in stats.items():
        rms = (entry["sq"] / entry["n"]).sqrt()
        ratio = entry["max"] / rms.clamp_min(1e-12)
        layers[name] = {
            "max_abs": round(entry["max"].max().item(), 4),
            "median_channel_rms": round(rms.median().item(), 4),
            "max_abs_over_median_rms": round((entry["max"].max() / rms.median().clamp_min(1e-12)).item(), 2),
            "max_channel_max_over_rms": round(ratio.max().item(), 2),
            "channels_above_6": int((entry["max"] > 6.0).sum().item()),  # LLM.int8()'s outlier magnitude
        }
    nll = total / count
    return {
        "heldout_tokens": int(count),
        "heldout_windows": len(windows),
        "nll": round(nll, 5),
        "perplexity": round(math.exp(nll), 3),
        "unigram_nll": round(unigram, 5),
        "unigram_perplexity": round(math.exp(unigram), 3),
        "activations": layers,
    }


def _build(recipe: Recipe, corpus: Corpus, folder: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        started = time.monotonic()
        tok = train_tokenizer(corpus.train, recipe.vocab)
        train = encode(tok, corpus.train)
        heldout = encode(tok, corpus.heldout)
        stream = torch.tensor([t for doc in train for t in doc], dtype=torch.int32)
        log.info("corpus %s: %d train tokens, %d held-out tokens", corpus.digest[:12], len(stream), sum(map(len, heldout)))
        model = _train(recipe, tok, stream, folder)
        trained = time.monotonic() - started
        report = evaluate(model, heldout, torch.bincount(stream.long(), minlength=len(tok)), recipe)
        report.update(
            train_tokens_seen=recipe.steps * recipe.batch * recipe.sequence,
            corpus_train_tokens=len(stream),
            parameters=sum(p.numel() for p in model.parameters()),
            build_seconds=round(trained, 1),
            threads=recipe.threads,
        )
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


def build(recipe: str | Recipe = "full", root: Path | None = None) -> Path:
    """The Hugging Face folder of ``recipe``'s model: trained on the first call, found after."""
    recipe_ = RECIPES[recipe] if isinstance(recipe, str) else recipe
    base = root or cache_root()
    corpus = build_corpus(recipe_.corpus, base)
    key = recipe_key(recipe_, corpus.digest)
    folder = base / "models" / f"{recipe_.name}-{key[:24]}"
    if (folder / "recipe.json").is_file():
        log.info("reference decoder %s: cached at %s", recipe_.name, folder)
        return folder
    log.info("reference decoder %s: training (key %s, corpus %s)", recipe_.name, key[:12], corpus.digest[:12])
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=folder.parent))
    try:
        _build(recipe_, corpus, tmp)
        recipe_json = {"key": key, "recipe": asdict(recipe_), "corpus": corpus.summary, "versions": _versions()}
        (tmp / "recipe.json").write_text(json.dumps(recipe_json, indent=1, sort_keys=True) + "\n")  # last: marks it complete
        if (folder / "recipe.json").is_file():
            shutil.rmtree(tmp)
        else:
            tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def heldout_tokens(folder: Path, recipe: str | Recipe = "full", root: Path | None = None) -> tuple[list[list[int]], list[str]]:
    """The held-out documents of the model's corpus, encoded by its tokenizer, and their ids."""
    from transformers import PreTrainedTokenizerFast

    recipe_ = RECIPES[recipe] if isinstance(recipe, str) else recipe
    corpus = build_corpus(recipe_.corpus, root)
    return encode(PreTrainedTokenizerFast.from_pretrained(folder), corpus.heldout), corpus.heldout_ids


def load(recipe: str = "full") -> tuple[Any, Any]:
    """The workflow factory: ``(model, tokenizer)`` of the cached model, built first if missing."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    folder = build(recipe)
    return LlamaForCausalLM.from_pretrained(folder).eval(), PreTrainedTokenizerFast.from_pretrained(folder)


def load_tiny() -> tuple[Any, Any]:
    return load("tiny")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="full")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    path = build(args.recipe)
    report = json.loads((path / "report.json").read_text())
    print(path)
    print(json.dumps({k: v for k, v in report.items() if k != "activations"}, indent=1))
    for name, entry in report["activations"].items():
        print(f"{name:<40} {json.dumps(entry)}")
