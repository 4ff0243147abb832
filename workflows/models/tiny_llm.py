"""A tiny Llama-style decoder trained, deterministically and in seconds, on real English text.

``build()`` is the factory ``workflows/llm-cpu.yaml`` names. It reads the byte-level BPE tokenizer
shipped in ``tiny_llm/`` (trained once on the same text by ``tokenizer()`` below), builds a
Llama model from a transformers config (grouped-query attention, rotary positions, SwiGLU), and
trains it for ``steps`` steps on ``../data/english/train.txt``: paragraphs of the Python Language
Reference. The held-out paragraphs (``heldout.txt``) are never trained on, so the perplexity the
workflow measures on them is a real generalisation figure, and what INT4 costs is measured against
a model that has learned something. Same code, same library versions → same weights, bit for bit
(one thread, fixed seed, deterministic algorithms).

It returns ``(model, tokenizer)``: the decoder export passes save both as a Hugging Face folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
TOKENIZER = HERE / "tiny_llm"
CORPUS = HERE.parent / "data" / "english"
VOCAB = 1024
SIZES = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}


def tokenizer() -> Any:
    """The shipped tokenizer; ``python workflows/models/tiny_llm.py`` trains it again."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(TOKENIZER)


def train_tokenizer() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([str(CORPUS / "train.txt")], trainer)
    end = "<|endoftext|>"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end, pad_token=end)
    fast.save_pretrained(TOKENIZER)


def build(steps: int = 250, seq: int = 64, batch: int = 16, seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    text = (CORPUS / "train.txt").read_text()
    ids = torch.tensor(tok(text.replace("\n", tok.eos_token))["input_ids"], dtype=torch.long)
    config = LlamaConfig(
        vocab_size=len(tok), max_position_embeddings=512, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, **SIZES
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps, pct_start=0.1)
        model.train()
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=generator)
            chunk = torch.stack([ids[s : s + seq + 1] for s in starts.tolist()])
            loss = model(input_ids=chunk[:, :-1], labels=chunk[:, :-1]).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model, tok


if __name__ == "__main__":
    train_tokenizer()
