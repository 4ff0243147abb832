"""The options of `engine optimize` (a light module: the CLI builds its parser from it on every start, and
the rest of the command loads only when it runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEVICES = ("cpu", "gpu", "npu")
PRECISIONS = ("fp32", "fp16", "int8", "int4")
TASKS = (
    "feature-extraction",
    "text-classification",
    "text-generation",
    "text2text-generation",
    "automatic-speech-recognition",
    "image-classification",
    "object-detection",
    "semantic-segmentation",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `engine optimize` beside those it shares with `engine run`."""
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a Hugging Face model folder (config.json), an ONNX file or a folder holding model.onnx, or a Hub id ORG/NAME",
    )
    parser.add_argument("--device", default="cpu", metavar="cpu|gpu|npu", help="where the model will run: cpu (default), gpu or npu")
    parser.add_argument(
        "--provider",
        metavar="EP",
        help="the runtime on that device: an ONNX Runtime execution provider (cpu; cuda, tensorrt, dml; qnn) or openvino "
        "(OpenVINO's own runtime); default: cpu on cpu, cuda on gpu, on npu openvino (x86) or qnn (Arm)",
    )
    parser.add_argument(
        "--precision",
        metavar="fp32|fp16|int8|int4",
        help="fp32, fp16, int8 or int4 (default: int8 on cpu and npu, fp16 on gpu; int4 for decoders)",
    )
    parser.add_argument("--task", metavar="TASK", help=f"what the model does: {', '.join(TASKS)} (default: read from its config.json)")
    parser.add_argument(
        "--max-drop",
        type=float,
        metavar="X",
        help="the quality a candidate may lose against the FP32 model: 1 - cosine of its outputs for encoders "
        "(default 0.01), the mean NLL increase per token for decoders (default 0.05, about 5%% perplexity), the share of "
        "first decoder steps whose top token differs from FP32's for encoder-decoder models (default 0.05)",
    )
    parser.add_argument("--max-candidates", type=int, metavar="N", help="measure at most N candidates (the FP32 reference included)")
    parser.add_argument("--revision", metavar="REV", help="for a Hub id: the branch, tag or commit")
    parser.add_argument(
        "--workflow",
        "-o",
        type=Path,
        metavar="FILE",
        help="the workflow file to write (default: ./<model>-<device>[-<provider>]-<precision>.yaml)",
    )
    parser.add_argument("--force", action="store_true", help="replace the workflow file even when it was edited or is not one this wrote")
    parser.add_argument("--dry-run", action="store_true", help="write and show the workflow, run nothing")
    parser.add_argument("--output", type=Path, metavar="DIR", help="output folder of the run (default: out/<workflow name>)")


def prepare(args: argparse.Namespace) -> Path | None:
    """Write, check and show the workflow ``args`` ask for; the file to run, or None after --dry-run."""
    from engine.optimize.command import prepare as write_workflow  # the workflow loader and its plugins load here, not at start

    return write_workflow(args)
