"""`engine optimize MODEL`: write the workflow that optimizes MODEL for a device, check it with the
ordinary loader, show it, save it; `engine run` then runs it as it runs any workflow."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from engine import __version__
from engine.core.errors import InputError, Problem
from engine.optimize.model import ModelFacts, find_model
from engine.optimize.options import DEVICES, PRECISIONS, TASKS
from engine.optimize.pipelines import Choice, Pipeline, workflow
from engine.workflow import ResolvedWorkflow, load_workflow
from engine.workflow.schema import InputSpec

#: per device, the providers offered (the first is the default; on an x86 host the NPU default is OpenVINO)
PROVIDERS = {"cpu": ("cpu", "openvino"), "gpu": ("cuda", "tensorrt", "dml", "openvino"), "npu": ("qnn", "openvino")}
WORDS = {"cpuexecutionprovider": "cpu", "cudaexecutionprovider": "cuda", "tensorrtexecutionprovider": "tensorrt", "trt": "tensorrt"}
WORDS |= {"dmlexecutionprovider": "dml", "directml": "dml", "qnnexecutionprovider": "qnn", "openvinoexecutionprovider": "openvino"}
WORDS |= {"ov": "openvino", **{name: name for names in PROVIDERS.values() for name in names}}
RUNTIMES = {
    "cpu": "ONNX Runtime, CPUExecutionProvider",
    "cuda": "ONNX Runtime, CUDAExecutionProvider",
    "tensorrt": "ONNX Runtime, TensorrtExecutionProvider (CUDA for the rest)",
    "dml": "ONNX Runtime, DmlExecutionProvider",
    "qnn": "ONNX Runtime, QNNExecutionProvider",
    "openvino": "OpenVINO's runtime",
}
DEFAULT_PRECISION = {"cpu": "int8", "gpu": "fp16", "npu": "int8"}
HEADER = "# Written by `engine optimize`"
COMMAND = "engine optimize"  # where a problem with the command's options is said to be
DIGEST = "\n# digest: sha256:"


def _bad(where: str, message: str, given: str, expected: str | None = None, hint: str | None = None) -> InputError:
    return InputError([Problem(where=where, message=message, expected=expected, given=given, hint=hint, file=COMMAND)])


def default_provider(device: str) -> str:
    if device == "npu":
        return "qnn" if platform.machine().lower() in ("arm64", "aarch64") else "openvino"
    return PROVIDERS[device][0]


def _provider(device: str, given: str | None) -> str:
    if given is None:
        return default_provider(device)
    key = WORDS.get(given.lower())
    offered = ", ".join(PROVIDERS[device])
    if key is None:
        raise _bad("--provider", "is not a provider `engine optimize` knows", given, expected=f"on {device}: {offered}")
    if key not in PROVIDERS[device]:
        where = [d for d, names in PROVIDERS.items() if key in names]
        raise _bad("--provider", f"does not run on {device}", given, expected=f"on {device}: {offered}", hint=f"--device {where[0]}")
    return key


def _refusal(facts: ModelFacts, provider: str, precision: str, device: str) -> Problem | None:
    """Why this model, provider and precision make no workflow (with the fix), or None."""
    if facts.kind == "decoder" and provider not in ("cpu", "cuda", "dml"):
        return Problem(
            "--provider",
            "decoders run on ONNX Runtime GenAI, with models the GenAI model builder makes for cpu, cuda or dml",
            expected="--device cpu, or --device gpu with --provider cuda or dml",
            given=f"--device {device} --provider {provider}",
            hint="--device cpu",
        )
    if facts.kind == "seq2seq" and provider != "cpu":
        return Problem(
            "--provider",
            "encoder-decoder models are optimized for ONNX Runtime's CPU provider (dynamic INT8 of the encoder and the decoder)",
            expected="--device cpu",
            given=f"--device {device} --provider {provider}",
            hint="--device cpu",
        )
    if facts.kind == "seq2seq" and precision not in ("int8", "fp32"):
        expected, hint = "int8 or fp32", "--precision int8"
        message = "an encoder-decoder model is offered at int8 (dynamic, both parts) and fp32"
    elif facts.kind == "decoder" and precision == "fp16" and device == "cpu":
        expected, hint = "int4, int8 or fp32 on cpu", "--precision int4, or --device gpu for fp16"
        message = "FP16 decoders run on GPUs only (ONNX Runtime's CPU kernels fail on the model builder's FP16 model)"
    elif provider == "tensorrt" and precision in ("int8", "int4"):
        expected, hint = "fp32 or fp16", "--precision fp16, or --provider cuda for INT8 (static QDQ) and INT4"
        message = "TensorRT is offered at fp32 and fp16 (an INT8 QDQ model for TensorRT has not been measured yet)"
    elif provider == "qnn" and precision == "int4":
        expected, hint = "int8, fp16 or fp32", "--precision int8"
        message = "the QNN NPU runs INT8 (QDQ) and FP16 models"
    else:
        return None
    return Problem("--precision", message, expected=expected, given=precision, hint=hint, file=COMMAND)


def choose(args: argparse.Namespace, facts: ModelFacts) -> Choice:
    """The device, provider and precision (defaults filled in), checked against each other and the model."""
    device = str(args.device).lower()
    if device not in DEVICES:
        raise _bad("--device", "is not a device `engine optimize` knows", args.device, expected=", ".join(DEVICES))
    provider = _provider(device, args.provider)
    precision = args.precision or ("int4" if facts.kind == "decoder" and device != "npu" else DEFAULT_PRECISION[device])
    if precision not in PRECISIONS:
        raise _bad("--precision", "is not a precision `engine optimize` knows", precision, expected=", ".join(PRECISIONS))
    refused = _refusal(facts, provider, precision, device)
    if refused:
        raise InputError([replace(refused, file=COMMAND)])
    max_drop = args.max_drop if args.max_drop is not None else 0.05 if facts.kind in ("decoder", "seq2seq") else 0.01
    if not 0 < max_drop < 1:
        raise _bad("--max-drop", "must be above 0 and below 1", str(args.max_drop), hint="--max-drop 0.01 (cosine at least 0.99)")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise _bad("--max-candidates", "needs at least one candidate", str(args.max_candidates), hint="--max-candidates 4")
    output = str(args.output) if args.output else None
    return Choice(device, provider, precision, max_drop, args.max_candidates, output)


def _command_line(args: argparse.Namespace, choice: Choice) -> str:
    words = ["engine", "optimize", args.model, "--device", choice.device]
    words += ["--provider", choice.provider] if args.provider else []
    words += ["--precision", choice.precision]
    for flag, value in (("--task", args.task), ("--max-drop", args.max_drop), ("--max-candidates", args.max_candidates)):
        words += [flag, str(value)] if value is not None else []
    words += ["--revision", args.revision] if args.revision else []
    words += ["--output", str(args.output)] if args.output else []
    return shlex.join(words)


def render(facts: ModelFacts, choice: Choice, body: dict[str, Any], pipeline: Pipeline, command: str) -> str:
    """The workflow file: a header saying what it does and why, then the workflow; the digest marks it as written here."""
    width = max(len(step_id) for step_id, _ in pipeline.why) if pipeline.why else 0
    target = body["targets"][0]
    lines = [
        f"{HEADER} (Kiln {__version__}):",
        f"#   {command}",
        f"# The model: {facts.described}.",
        f"# The target: {target['id']} ({RUNTIMES[choice.provider]}) on {choice.device}, at {choice.precision}.",
        "# Steps (each root-to-leaf path is a candidate; the first model the target runs is the FP32 reference):",
        *(f"#   {step_id:<{width}}  {why}" for step_id, why in pipeline.why),
        "# Chosen: " + _rule(facts, choice),
        "# Edit it and run it with `engine run FILE`; `engine optimize` does not replace a file edited since it wrote it.",
    ]
    text = str(yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True))
    return "\n".join(lines) + DIGEST + hashlib.sha256(text.encode()).hexdigest() + "\n" + text


def _rule(facts: ModelFacts, choice: Choice) -> str:
    if facts.kind == "decoder":
        held = "held-out" if facts.tokenizer else "synthetic-id (no tokenizer found)"
        return (
            f"the most decode tokens per second (timed against FP32 in interleaved rounds) whose {held} NLL per token\n"
            f"#   rises at most {choice.max_drop:g} over FP32's (about {choice.max_drop:.0%} perplexity), judged on its 95% interval\n"
            "#   (first on 8 rows at 97.5%; on every row only where that interval straddles the bar: search.staged)."
        )
    if facts.kind == "seq2seq":
        sources = (
            "held-out lines shipped with Kiln"
            if facts.tokenizer
            else "synthetic log-mel features"
            if facts.task == "automatic-speech-recognition"
            else "synthetic token ids: no tokenizer found"
        )
        return (
            "the most tokens per second end to end (encoder and greedy decoding, timed against FP32 in interleaved rounds)\n"
            f"#   whose first decoder step picks FP32's top token on at least {1 - choice.max_drop:.0%} of the sources "
            f"({sources}), judged on its 95% interval."
        )
    data = (
        "160 held-out lines shipped with Kiln (32 others calibrate)\n#   and, as a second bar, over 64 full-length English paragraphs shipped with Kiln (long text can fail where lines pass)"
        if facts.tokenizer
        else "held-out synthetic pixel_values (standard normal; 32 others calibrate)"
        if facts.kind == "vision"
        else "held-out synthetic inputs (no tokenizer found)"
    )
    return (
        "the fastest candidate (latency as a speedup over FP32, interleaved rounds, 95% interval) whose outputs keep\n"
        f"#   cosine >= {1 - choice.max_drop:g} to FP32's on the lower 95% bound, over {data}."
    )


def _untouched(text: str) -> bool:
    """Whether ``text`` is a workflow this command wrote and nobody edited since."""
    head, marker, rest = text.partition(DIGEST)
    digest, _, body = rest.partition("\n")
    return bool(marker) and head.startswith(HEADER) and hashlib.sha256(body.encode()).hexdigest() == digest


def _check_existing(dest: Path, text: str, force: bool) -> str:
    """What writing ``dest`` does: 'wrote', 'kept' (the same text) or 'replaced'; refuses to replace an edited or foreign file."""
    if not dest.exists():
        return "wrote"
    if not dest.is_file():
        raise _bad("--workflow", "is not a file", str(dest), hint="name a .yaml file")
    try:
        old = dest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        old = ""
    if old == text:
        return "kept"
    if force or _untouched(old):
        return "replaced"
    raise _bad(
        "--workflow",
        "exists and differs from the workflow these options make: it was edited, or `engine optimize` did not write it",
        str(dest),
        hint=f"run it as it is (engine run {shlex.quote(str(dest))}), name another file with -o, or replace it with --force",
    )


def _save(dest: Path, text: str, facts: ModelFacts) -> ResolvedWorkflow:
    """Check the text with the ordinary loader, then move it into place; the resolved workflow."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".yaml", dir=dest.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as error:
        raise _bad("--workflow", f"cannot be written: {error.strerror or error}", str(dest), hint="name another file with -o") from error
    try:
        resolved = load_workflow(temporary)
    except InputError as error:
        Path(temporary).unlink(missing_ok=True)
        problems = [replace(problem, file=str(dest)) for problem in error.problems]
        if all(problem.where.startswith("input") for problem in problems):  # the model itself: the user's to fix
            raise InputError(problems) from None
        raise RuntimeError(
            f"engine optimize wrote a workflow that does not validate ({facts.described}):\n{InputError(problems)}"
        ) from None
    os.replace(temporary, dest)
    return resolved


def prepare(args: argparse.Namespace) -> Path | None:
    """Write, check and show the workflow; the file to run, or None after --dry-run."""
    if args.task is not None and args.task not in TASKS:
        raise _bad("--task", "is not a task `engine optimize` knows", args.task, expected=", ".join(TASKS))
    facts = find_model(args.model, args.task, args.revision)
    if "model" in facts.input and "model" not in InputSpec.model_fields:
        raise _bad(
            "MODEL",
            "is a Hugging Face Hub id, and this Kiln reads models from files only",
            args.model,
            hint=f"download it (hf download {args.model} --local-dir DIR) and give the folder",
        )
    choice = choose(args, facts)
    suffix = f"-{choice.provider}" if args.provider and choice.provider != default_provider(choice.device) else ""
    name = f"{facts.name}-{choice.device}{suffix}-{choice.precision}"
    body, pipeline = workflow(facts, choice, name)
    text = render(facts, choice, body, pipeline, _command_line(args, choice))
    dest = Path(args.workflow) if args.workflow else Path(f"{name}.yaml")
    if dest.suffix.lower() not in (".yaml", ".yml"):
        raise _bad(
            "--workflow",
            "the workflow is written as YAML",
            str(dest),
            expected="a .yaml or .yml file",
            hint=f"-o {dest.with_suffix('.yaml')}",
        )
    action = _check_existing(dest, text, args.force)
    resolved = _save(dest, text, facts) if action != "kept" else load_workflow(dest)
    _show(args, facts, choice, text, dest, action, resolved)
    return None if args.dry_run else dest


def _show(
    args: argparse.Namespace, facts: ModelFacts, choice: Choice, text: str, dest: Path, action: str, resolved: ResolvedWorkflow
) -> None:
    precision_note = "" if args.precision else f" (the default{' for decoders' if facts.kind == 'decoder' else ''} on {choice.device})"
    if not args.quiet:
        print(f"model:     {args.model}: {facts.described}")
        print(f"target:    {RUNTIMES[choice.provider]} on {choice.device}")
        print(f"precision: {choice.precision}{precision_note}\n")
        head, _, rest = text.partition(DIGEST)
        print(head + "\n" + rest.split("\n", 1)[1])
    targets = resolved.targets.values()
    skipped = [f"{t.id} ({t.availability.reason})" for t in targets if not t.availability.ok]
    note = f"; not usable here: {', '.join(skipped)}" if skipped else ""
    print(f"{action} {dest} (valid: {len(resolved.steps)} steps, {len(resolved.evaluators)} evaluations){note}")
    if args.dry_run:
        print(f"dry run: nothing was run; run it with: engine run {shlex.quote(str(dest))}")
    else:
        print(f"running {dest} (the same as `engine run {shlex.quote(str(dest))}`)")
