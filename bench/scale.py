"""Real size: a Llama-geometry decoder from a folder to its chosen INT4 model, and an encoder past
protobuf's 2 GB limit through export, fusion and INT8, each from an empty store.

    python bench/scale.py [--size 0.7b|1.3b|tiny] [--encoder-2gb] [--no-decoder] [--full-evaluation] [--keep DIR]

The decoder is built from a transformers config with random weights (seeded), saved as fp32
safetensors in three shards without a tokenizer (so the engine feeds seeded random token ids):
``0.7b`` is hidden 1536, 24 layers, GQA 12/4 heads, MLP 4096, vocabulary 32000 (702 M parameters,
2.8 GB); ``1.3b`` hidden 2048, 26 layers, GQA 16/4, MLP 5632 (1.3 B, 5.2 GB); ``tiny`` a smoke
run's few-MB model. It runs ``engine optimize DIR --device cpu --precision int4`` in a subprocess
and prints the wall time, split into passes and evaluations from the run's ``events.jsonl`` (the
wall time during which at least one pass, or one evaluation, was running, and the seconds summed
over jobs), the peak memory of the engine and its workers, and the choice (``candidates.json``).

``--full-evaluation`` then runs the workflow ``engine optimize`` wrote again with ``search.staged:
false`` (every row of every candidate scored) from another empty store and says whether it
chose the same model.

``--encoder-2gb`` does the same for a BERT-geometry encoder (36 layers, hidden 1536, 24 heads, MLP
6144: 1.07 B parameters, 4.3 GB of fp32; ``--size tiny``: a small one through the same workflow)
through ``torch_export -> ort_fusion -> ort_quantize`` (dynamic INT8 per channel), a workflow the
bench writes, and then loads the chosen model in ONNX Runtime in a fresh process.

Peak memory: the process tree's resident memory (the engine, its worker pool and the builders they
start) summed and sampled every 0.2 s from /proc (psutil is not a Kiln dependency; /proc says the
same on Linux), and the largest single process's own peak (its VmHWM, read at the same samples),
each also as a multiple of the fp32 model's bytes. The tree's proportional set size (smaps_rollup,
which walks every mapping of a process: a quarter of a core at 5 samples a second with a 2.8 GB
model mapped) is read at most once a second, and only while the tree's resident memory is within
5% of its peak so far: the sampler's own load counts as "others" in Kiln's noise meter, and at a
quarter of a core it pushed the decoder's generation timings past their 0.3-core busy threshold
(rounds thrown away and taken again: 1127 s for the whole run against 441-516 s). The bench prints
the CPU its sampler used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _records import read_events

#: the decoders: hidden, layers, attention heads, key/value heads, MLP width, vocabulary
DECODERS: dict[str, dict[str, int]] = {
    "0.7b": {"hidden": 1536, "layers": 24, "heads": 12, "kv_heads": 4, "mlp": 4096, "vocab": 32000},
    "1.3b": {"hidden": 2048, "layers": 26, "heads": 16, "kv_heads": 4, "mlp": 5632, "vocab": 32000},
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 128, "vocab": 1000},
}
#: the encoders (BERT geometry): hidden, layers, heads, MLP width, vocabulary
ENCODERS: dict[str, dict[str, int]] = {
    "large": {"hidden": 1536, "layers": 36, "heads": 24, "mlp": 6144, "vocab": 30522},
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "mlp": 128, "vocab": 1000},
}
SAMPLE_S = 0.2
#: the tree's PSS (smaps_rollup) at most this often, and only near the RSS peak (its cost above)
PSS_EVERY_S = 1.0
PSS_NEAR_PEAK = 0.95


def build_decoder(folder: Path, size: str) -> int:
    """A random-weight Llama decoder of ``size`` saved in ``folder`` (three safetensors shards); its fp32 bytes."""
    import torch
    import transformers

    g = DECODERS[size]
    config = transformers.LlamaConfig(
        hidden_size=g["hidden"],
        intermediate_size=g["mlp"],
        num_hidden_layers=g["layers"],
        num_attention_heads=g["heads"],
        num_key_value_heads=g["kv_heads"],
        vocab_size=g["vocab"],
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _save(transformers.LlamaForCausalLM, config, folder, torch)


def build_encoder(folder: Path, size: str) -> int:
    """A random-weight BERT encoder of ``size`` saved in ``folder`` (three safetensors shards); its fp32 bytes."""
    import torch
    import transformers

    g = ENCODERS[size]
    config = transformers.BertConfig(
        hidden_size=g["hidden"],
        num_hidden_layers=g["layers"],
        num_attention_heads=g["heads"],
        intermediate_size=g["mlp"],
        vocab_size=g["vocab"],
        max_position_embeddings=512,
    )
    return _save(transformers.BertModel, config, folder, torch)


def _save(cls: Any, config: Any, folder: Path, torch: Any) -> int:
    torch.manual_seed(0)
    model = cls(config).eval()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    shard = f"{max(1, -(-total // 3 // 1_000_000))}MB"  # three shards, as a Hub checkpoint of this size comes
    model.save_pretrained(folder, max_shard_size=shard, safe_serialization=True)
    del model
    return int(total)


def encoder_workflow(folder: Path, model: Path, vocab: int) -> Path:
    """torch_export -> ort_fusion -> ort_quantize (dynamic INT8 per channel) with fidelity, size and latency."""
    workflow = {
        "version": 1,
        "name": "scale-encoder",
        "input": {"format": "hf", "path": str(model), "task": "feature-extraction"},
        "data": {"heldout": {"source": "synthetic", "samples": 16, "sequence_length": 128, "int_high": vocab, "seed": 1}},
        "targets": [{"id": "ort-cpu", "runtime": "onnxruntime", "device": "cpu"}],
        "steps": [
            {
                "id": "export",
                "pass": "torch_export",
                "config": {"exporter": "torchscript", "attn_implementation": "eager", "opset": 17, "task": "feature-extraction"},
            },
            {"id": "fuse", "pass": "ort_fusion", "after": "export", "config": {"model_type": "bert"}},
            {"id": "int8", "pass": "ort_quantize", "after": "fuse", "config": {"mode": "dynamic", "per_channel": True}},
        ],
        "evaluate": [
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "heldout"}},
            {"id": "size", "evaluator": "size"},
            {
                "id": "latency",
                "evaluator": "latency",
                "config": {"batch_size": 1, "sequence_length": 128, "int_high": vocab, "warmup": 5, "runs": 20, "max_time_s": 60},
            },
        ],
        "select": {
            "objective": {"metric": "latency.p50_ms", "goal": "min"},
            "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.99}],
        },
    }
    path = folder / "scale-encoder.json"
    path.write_text(json.dumps(workflow, indent=2))
    return path


class TreeMemory:
    """The summed resident memory of a process and its descendants, sampled from /proc until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.peak_processes = pid, 0, 0
        # the tree's proportional set size: a page shared by processes (a mapped checkpoint's page cache) counted once
        self.peak_pss = 0
        self.single = 0  # the largest peak (VmHWM) of one process seen alive at a sample
        self.largest = (0, 0.0)  # the largest resident memory of one process at a sample, and when (time.time())
        self.cpu_s = 0.0  # the sampler's own CPU time: Kiln's noise meter counts it as another process's load
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        began, pss_read = time.thread_time(), float("-inf")
        while not self._stop.is_set():
            pids = _tree(self.pid)
            figures = [_memory(pid) for pid in pids]
            total = sum(rss for rss, _ in figures)
            now = time.monotonic()
            if total >= PSS_NEAR_PEAK * self.peak and now - pss_read >= PSS_EVERY_S:
                self.peak_pss, pss_read = max(self.peak_pss, sum(_pss(pid) for pid in pids)), now
            self.single = max([self.single, *(hwm for _, hwm in figures)])
            biggest = max((rss for rss, _ in figures), default=0)
            if biggest > self.largest[0]:
                self.largest = (biggest, time.time())
            if total > self.peak:
                self.peak, self.peak_processes = total, len(pids)
            self.cpu_s = time.thread_time() - began
            self._stop.wait(SAMPLE_S)


def _tree(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _memory(pid: int) -> tuple[int, int]:
    """A process's resident memory now and its peak so far (VmRSS, VmHWM), in bytes; 0s once it is gone."""
    found = {"VmRSS:": 0, "VmHWM:": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0] + ":"
            if key in found:
                found[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found["VmRSS:"], found["VmHWM:"]


def _pss(pid: int) -> int:
    """A process's proportional set size now (smaps_rollup's Pss: a page mapped by n processes
    counts 1/n in each), in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_engine(args: list[str], cwd: Path) -> tuple[float, TreeMemory, subprocess.CompletedProcess[str]]:
    """``python -m engine ARGS`` with its tree's memory sampled: wall seconds, the samples' figures
    (peak of the tree's summed RSS, the largest single process's), the finished process."""
    started = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-m", "engine", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        with TreeMemory(process.pid) as memory:
            out, err = process.communicate()
    wall = time.perf_counter() - started
    return wall, memory, subprocess.CompletedProcess(process.args, process.returncode, out, err)


def spans(events: list[dict[str, Any]], starts: tuple[str, ...], ends: tuple[str, ...]) -> list[tuple[str, float, float, str]]:
    """Each job's span from ``events``: its label (candidate and job or evaluation), start and end
    times (the events' clock, time.time()) and its end's status."""
    opened: dict[str, float] = {}
    found = []
    for event in events:
        label = f"{event.get('candidate', '')} {event.get('job') or event.get('evaluation') or ''}".strip()
        if event.get("event") in starts:
            opened[label] = event["t"]
        elif event.get("event") in ends and label in opened:
            found.append((label, opened.pop(label), event["t"], event.get("status", "ran")))
    return found


def running_at(events: list[dict[str, Any]], moment: float) -> list[str]:
    """The passes and evaluations running at ``moment``."""
    return [
        label for label, began, ended, _ in spans(events, ("job_start", "eval_start"), ("job_end", "eval_end")) if began <= moment <= ended
    ]


def busy(events: list[dict[str, Any]], start: str, end: str) -> tuple[float, float, int]:
    """Wall seconds during which at least one such job ran (their union), seconds summed over them, and how many ran."""
    ran = [(b, e) for _, b, e, status in spans(events, (start,), (end,)) if status not in ("hit", "cached", "shared")]
    union, reach = 0.0, float("-inf")
    for began, ended in sorted(ran):
        if ended > reach:
            union += ended - max(began, reach)
            reach = ended
    return union, sum(e - b for b, e in ran), len(ran)


def report(title: str, wall: float, memory: TreeMemory, model_bytes: int, out: Path, done: subprocess.CompletedProcess[str]) -> None:
    gb, peak, single = 1024**3, memory.peak, memory.single
    print(f"\n== {title}: exit {done.returncode}, {wall:.1f} s wall")
    events_file = out / "events.jsonl"
    events = read_events(events_file) if events_file.is_file() else []
    for name, start, end in (("passes", "job_start", "job_end"), ("evaluations", "eval_start", "eval_end")):
        union, summed, count = busy(events, start, end)
        print(f"  {name:<12} {union:8.1f} s wall ({summed:.1f} s summed over {count} jobs)")
    print(
        f"  peak memory  {peak / gb:8.2f} GiB, engine and workers together ({peak / model_bytes:.2f}x the fp32 model's {model_bytes / gb:.2f} GiB)"
    )
    pss = memory.peak_pss
    print(f"               {pss / gb:8.2f} GiB, the same with pages shared by processes counted once (PSS; {pss / model_bytes:.2f}x)")
    print(f"               {single / gb:8.2f} GiB, the largest single process ({single / model_bytes:.2f}x)")
    print(f"  the sampler  {memory.cpu_s:8.1f} s of CPU ({memory.cpu_s / wall:.3f} cores on average: load Kiln's noise meter counts)")
    if memory.largest[0]:
        jobs = running_at(events, memory.largest[1])
        print(
            f"               {memory.largest[0] / gb:8.2f} GiB in one process at a sample, while: {'; '.join(jobs) or 'no job (the engine)'}"
        )
    candidates = out / "candidates.json"
    if candidates.is_file():
        for line in choice(json.loads(candidates.read_text())):
            print(f"  {line}")
    if done.returncode not in (0, 1):
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")


def choice(document: Any) -> list[str]:
    """One line per candidate: chosen or not, its label, state and the figures that chose."""
    rows = document.get("candidates", document) if isinstance(document, dict) else document
    lines = []
    for row in rows if isinstance(rows, list) else []:
        metrics = row.get("metrics") or {}
        shown = {k: round(v, 4) for k, v in metrics.items() if k.split(".")[-1] in FIGURES and isinstance(v, (int, float))}
        mark = "CHOSEN" if row.get("chosen") else "      "
        stages = {
            name: e["details"]["stage"] for name, e in (row.get("evaluations") or {}).items() if (e.get("details") or {}).get("stage")
        }
        untimed = " (untimed: broke a bar)" if row.get("untimed") else ""
        lines.append(f"{mark} {row.get('path') or row.get('label') or row.get('id')}: {row.get('state')}{untimed} {shown}")
        lines.extend(f"         {name}: {stage}" for name, stage in stages.items())
    return lines


FIGURES = ("decode_speedup", "decode_tokens_per_s", "nll_increase", "top1_agreement", "cosine_mean", "speedup", "p50_ms", "bytes")


def chosen_loads(out: Path, cwd: Path) -> str:
    """Open the chosen encoder (its model.onnx in the output folder) in a fresh ONNX Runtime process."""
    found = [p for p in out.rglob("*.onnx") if "candidates" not in p.parts]
    if not found:
        return "no chosen model.onnx in the output"
    code = "import onnxruntime, sys; s = onnxruntime.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider']); print([i.name for i in s.get_inputs()])"
    done = subprocess.run([sys.executable, "-c", code, str(found[0])], capture_output=True, text=True, check=False, cwd=cwd)
    return (
        f"{found[0].relative_to(out)} loads: inputs {done.stdout.strip()}"
        if done.returncode == 0
        else f"does NOT load: {done.stderr[-2000:]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(DECODERS), default="0.7b", help="the decoder's size (tiny: a smoke run)")
    parser.add_argument("--encoder-2gb", action="store_true", help="also the encoder past 2 GB (with --size tiny: a small one)")
    parser.add_argument("--no-decoder", action="store_true", help="skip the decoder (with --encoder-2gb: the encoder alone)")
    parser.add_argument(
        "--full-evaluation",
        action="store_true",
        help="then the decoder's workflow again with search.staged false in a new store (every row of every candidate "
        "scored) and whether it chooses the same",
    )
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-scale-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if not args.no_decoder:
            decoder(root, args.size, args.full_evaluation)
        if args.encoder_2gb:
            encoder(root, "tiny" if args.size == "tiny" else "large")


def decoder(root: Path, size: str, full_evaluation: bool) -> None:
    """``engine optimize`` the decoder from an empty store; with ``full_evaluation`` its workflow again, unstaged."""
    model = root / f"decoder-{size}"
    model_bytes = build_decoder(model, size)
    print(f"built a {size} Llama decoder with random weights: {model_bytes / 1e9:.2f} GB of fp32 in {model}", flush=True)
    out, workflow = root / "out-decoder", root / "decoder-int4.yaml"
    optimize = ["optimize", str(model), "--device", "cpu", "--precision", "int4", "--store", str(root / "store-decoder"), "-q"]
    wall, memory, done = run_engine([*optimize, "-o", str(workflow), "--force", "--output", str(out)], cwd=root)
    report(f"engine optimize {size} decoder --precision int4", wall, memory, model_bytes, out, done)
    if not full_evaluation:
        return
    import yaml

    document = yaml.safe_load(workflow.read_text())
    document.setdefault("search", {})["staged"] = False
    unstaged, full_out = root / "decoder-int4-unstaged.yaml", root / "out-decoder-unstaged"
    unstaged.write_text(yaml.safe_dump(document, sort_keys=False))
    wall, memory, done = run_engine(["run", str(unstaged), "--store", str(root / "store-unstaged"), "-o", str(full_out), "-q"], root)
    report(f"engine run {unstaged.name} (every row scored)", wall, memory, model_bytes, full_out, done)
    picked = [chosen_path(folder / "candidates.json") for folder in (out, full_out)]
    print(f"  same choice as the staged run: {picked[0] == picked[1]} (staged: {picked[0]}; every row: {picked[1]})")


def chosen_path(candidates: Path) -> str | None:
    rows = json.loads(candidates.read_text())["candidates"] if candidates.is_file() else []
    return next((row.get("path") for row in rows if row.get("chosen")), None)


def encoder(root: Path, size: str) -> None:
    """``engine run`` the encoder workflow from an empty store, then load its chosen model."""
    encoder = root / f"encoder-{size}"
    encoder_bytes = build_encoder(encoder, size)
    print(f"\nbuilt a {size} BERT encoder with random weights: {encoder_bytes / 1e9:.2f} GB of fp32", flush=True)
    workflow = encoder_workflow(root, encoder, ENCODERS[size]["vocab"])
    out = root / "out-encoder"
    wall, memory, done = run_engine(["run", str(workflow), "--store", str(root / "store-encoder"), "-o", str(out), "-q"], root)
    report(f"engine run {workflow.name} ({size} encoder)", wall, memory, encoder_bytes, out, done)
    print(f"  chosen model: {chosen_loads(out, root)}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
