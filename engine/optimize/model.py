"""What `engine optimize` was given: a local model (a Hugging Face folder, an ONNX file) or a Hub
id, and what kind of model it is (a text encoder, a decoder, an encoder-decoder, a vision model,
another ONNX model), read from its config.json (the task from its architectures,
engine.workflow.tasks) or from the ONNX graph's inputs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import InputError, Problem
from engine.workflow import files as userfiles
from engine.workflow import hub
from engine.workflow.tasks import SPEECH_TYPES, task_of_config

#: a Hub repository id: ORG/NAME, each part letters, digits, '-', '_', '.'
HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(?<![.-])$")
DECODER_ENDINGS = ("ForCausalLM", "LMHeadModel")
#: decoder families by model_type, for a config.json that lists no architectures
DECODER_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "phi", "phi3", "gpt2", "gemma", "gemma2", "granite", "olmo", "smollm3"}
VISION_TYPES = {"vit", "deit", "beit", "swin", "swinv2", "convnext", "convnextv2", "resnet", "regnet", "mobilenet_v2", "efficientnet"}
VISION_TYPES |= {"mobilevit", "dinov2", "clip_vision_model", "siglip_vision_model", "levit", "poolformer", "segformer", "yolos", "detr"}
#: the tasks of text models whose encoder `engine optimize` exports (a head it does not export keeps its backbone)
TEXT_TASKS = ("feature-extraction", "text-classification", "text-generation", "fill-mask", "token-classification", "question-answering")
TEXT_TASKS += ("multiple-choice",)
#: encoder-decoder families seq2seq_export takes, and the tasks it exports them for
SEQ2SEQ_TYPES = frozenset({"t5", "mt5", "bart", "mbart", "marian", "pegasus", "whisper"})
SEQ2SEQ_TASKS = ("text2text-generation", "automatic-speech-recognition")
#: the vision tasks torch_export exports (optimum's names)
VISION_TASKS = ("image-classification", "feature-extraction", "object-detection", "semantic-segmentation")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
GENERIC_NAMES = {"model", "models", "onnx", "hf", "checkpoint", "checkpoints", "snapshot", "export", "weights", "files"}
WHERE = "MODEL"


@dataclass(frozen=True)
class ModelFacts:
    """What the workflow is generated from."""

    input: dict[str, Any]  # the workflow's `input:` section
    name: str  # a plain name for the workflow and its file
    kind: str  # encoder (a Hugging Face text encoder), decoder (a causal LM), seq2seq (an encoder-decoder), vision, onnx
    described: str  # what it is, in words, for the terminal and the workflow's header
    task: str | None = None  # the Hugging Face task (encoders, decoders)
    tokenizer: str | None = None  # `input`, a tokenizer folder, or None (then synthetic token ids or features)
    max_length: int = 128  # tokens per text sample
    vocab_size: int | None = None
    inputs: dict[str, list[int | str]] = field(default_factory=dict)  # ONNX inputs: name -> shape

    @property
    def text(self) -> bool:
        return self.kind in ("encoder", "decoder") or "input_ids" in self.inputs


def _bad(message: str, given: str, expected: str | None = None, hint: str | None = None) -> InputError:
    return InputError([Problem(where=WHERE, message=message, expected=expected, given=given, hint=hint, file="engine optimize")])


def find_model(text: str, task: str | None, revision: str | None) -> ModelFacts:
    """The model ``text`` names, read; InputError saying what is wrong and the fix when it cannot be used."""
    path = Path(text).expanduser()
    if userfiles.exists(path):
        if revision:
            raise _bad("--revision is for a Hub id; this is a local path", text, hint="leave out --revision")
        return _local(path.resolve(), text, task)
    if HUB_ID.match(text) and not text.endswith((".onnx", ".json", ".yaml", ".yml")):
        return _hub(text, task, revision)
    raise _bad(
        "no such file or folder, and not a Hugging Face Hub id",
        text,
        expected="a Hugging Face model folder (config.json and weights), an .onnx file or a folder holding model.onnx, or a Hub id ORG/NAME",
        hint="check the path; a Hub model is named with its organisation (google-bert/bert-base-uncased, not bert-base-uncased)",
    )


def _local(path: Path, given: str, task: str | None) -> ModelFacts:
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir() and userfiles.exists(path / "config.json"):
        config = _read_config(path / "config.json", given)
        return _from_config(config, {"format": "hf", "path": str(path)}, _name_of(path), task, path, given)
    onnx_file = path / "model.onnx" if path.is_dir() else path
    if path.is_dir() and not userfiles.exists(onnx_file):
        raise _bad(
            "the folder holds neither config.json nor model.onnx",
            given,
            expected="a Hugging Face model folder (config.json and weights) or a folder holding model.onnx",
            hint="point at the folder save_pretrained wrote, or at the .onnx file",
        )
    if onnx_file.suffix != ".onnx":
        raise _bad("is not a model Kiln reads", given, expected="an .onnx file, or a folder (config.json or model.onnx)")
    problem = userfiles.onnx_file_problem(onnx_file)
    if problem:
        raise _bad(f"cannot be read as an ONNX model: {problem}", given, hint="point at a model saved by onnx.save or torch.onnx.export")
    return _from_onnx(onnx_file, {"format": "onnx", "path": str(path)}, given, task)


def _name_of(path: Path) -> str:
    """A plain name for the model: its folder's (or file's) name, the parent's when that name says nothing."""
    name = path.stem if path.suffix == ".onnx" else path.name
    if name.lower() in GENERIC_NAMES and path.parent.name:
        name = path.parent.name
    return plain_name(name)


def plain_name(text: str) -> str:
    """``text`` as a workflow name (a letter first, then letters, digits, '_' and '-')."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")
    return name if name[:1].isalpha() else f"m-{name}" if name else "model"


def _read_config(path: Path, given: str) -> dict[str, Any]:
    problem = userfiles.regular_file_problem(path)
    if problem is None:
        try:
            config = json.loads(path.read_bytes()[: userfiles.MAX_CONFIG_BYTES])
        except (ValueError, OSError, RecursionError) as error:
            problem = f"it is not JSON ({error})"
        else:
            if isinstance(config, dict):
                return config
            problem = "it is not a JSON object"
    raise _bad(f"config.json cannot be read: {problem}", given, hint="point at the folder save_pretrained wrote")


def _from_config(config: dict[str, Any], spec: dict[str, Any], name: str, task: str | None, folder: Path | None, given: str) -> ModelFacts:
    """A Hugging Face model by its config: a causal LM is a decoder, a text model an encoder; others are refused."""
    listed = config.get("architectures")
    architectures = [str(a) for a in listed] if isinstance(listed, list) else []
    model_type = str(config.get("model_type") or "unknown")
    shown = f"{model_type} ({', '.join(architectures)})" if architectures else model_type
    decoder = any(a.endswith(DECODER_ENDINGS) for a in architectures) or (not architectures and model_type in DECODER_TYPES)
    inferred, _ = task_of_config(config)
    if config.get("is_encoder_decoder") or model_type in SEQ2SEQ_TYPES:
        return _seq2seq(config, spec, name, task or inferred, shown, folder, given)
    if inferred is not None and inferred not in (*TEXT_TASKS, *VISION_TASKS) and model_type not in VISION_TYPES:
        raise _bad(
            f"a {inferred} model ({shown}): `engine optimize` makes workflows for text encoders, decoders and vision models",
            given,
            hint="write the workflow by hand (docs/workflow.md)",
        )
    if model_type in VISION_TYPES or (inferred in VISION_TASKS and inferred != "feature-extraction"):
        return _vision(config, spec, name, task or inferred or "feature-extraction", shown, given)
    task = task or (
        "text-generation"
        if decoder
        else "text-classification"
        if any("ForSequenceClassification" in a for a in architectures)
        else "feature-extraction"
    )
    if task == "text-generation" and not decoder and architectures:
        raise _bad(f"--task text-generation needs a causal LM (…ForCausalLM), and this is {shown}", given, hint="leave out --task")
    tokenizer = _tokenizer(folder)
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    max_length = min(128, positions) if isinstance(positions, int) and positions > 2 else 128
    vocab = _stated_vocab(config)
    kind = "decoder" if task == "text-generation" else "encoder"
    described = f"a {'decoder (causal LM)' if kind == 'decoder' else 'text encoder'}: {shown}"
    return ModelFacts(spec, name, kind, described, task, tokenizer, max_length, vocab)


def _stated_vocab(config: dict[str, Any]) -> int | None:
    """The vocabulary size config.json states (synthetic ids are drawn below it), when it is a number."""
    vocab = config.get("vocab_size")
    return vocab if isinstance(vocab, int) else None


def _tokenizer(folder: Path | None) -> str | None:
    """``input`` when the model's tokenizer is at hand (a Hub model's comes with it), else None: text is then synthetic ids."""
    return "input" if folder is None or any(userfiles.exists(folder / f) for f in TOKENIZER_FILES) else None


def _seq2seq(
    config: dict[str, Any], spec: dict[str, Any], name: str, task: str | None, shown: str, folder: Path | None, given: str
) -> ModelFacts:
    """An encoder-decoder model (Whisper, T5, BART, Marian): exported as an encoder and a decoder with past."""
    audio = str(config.get("model_type")) in SPEECH_TYPES or "num_mel_bins" in config
    task = task or ("automatic-speech-recognition" if audio else "text2text-generation")
    if task not in SEQ2SEQ_TASKS:
        raise _bad(
            f"a {task} model ({shown}): `engine optimize` exports encoder-decoder models for speech recognition and text to text",
            given,
            expected=", ".join(SEQ2SEQ_TASKS),
            hint="leave out --task (it is read from config.json); another encoder-decoder model needs a workflow written by hand (docs/workflow.md)",
        )
    if (task == "automatic-speech-recognition") != audio:
        right = "automatic-speech-recognition" if audio else "text2text-generation"
        raise _bad(f"--task {task} does not fit this model ({shown})", given, expected=right, hint="leave out --task")
    tokenizer = None if audio else _tokenizer(folder)
    vocab = _stated_vocab(config)
    what = "speech recognition" if audio else "text to text"
    return ModelFacts(spec, name, "seq2seq", f"an encoder-decoder model ({what}): {shown}", task, tokenizer, 128, vocab)


def _vision(config: dict[str, Any], spec: dict[str, Any], name: str, task: str, shown: str, given: str) -> ModelFacts:
    """A vision model: exported with its pixel_values (size from its image processor or config), batch dynamic."""
    if task not in VISION_TASKS:
        raise _bad(
            f"--task {task} does not apply to a vision model ({shown})",
            given,
            expected=", ".join(VISION_TASKS),
            hint="leave out --task: it is read from config.json",
        )
    return ModelFacts(spec, name, "vision", f"a vision model ({task}): {shown}", task)


def _from_onnx(onnx_file: Path, spec: dict[str, Any], given: str, task: str | None) -> ModelFacts:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except (OSError, ValueError, DecodeError) as error:
        raise _bad(f"cannot be read as an ONNX model: {error}", given) from error
    inputs = {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim] for value in _graph_inputs(model)}
    if any("past_key_values" in name or name.startswith("past.") for name in inputs):
        raise _bad(
            "an ONNX decoder with a key/value cache: `engine optimize` builds decoders from their Hugging Face folder",
            given,
            hint="give the Hugging Face folder (config.json, weights, tokenizer)",
        )
    if task not in (None, "feature-extraction", "text-classification"):
        raise _bad(f"--task {task} does not apply to an ONNX model", given, hint="leave out --task")
    folder = onnx_file.parent
    text = "input_ids" in inputs
    tokenizer = str(folder) if text and any(userfiles.exists(folder / f) for f in TOKENIZER_FILES) else None
    sequence = inputs.get("input_ids", [])
    fixed = sequence[1] if len(sequence) > 1 and isinstance(sequence[1], int) and sequence[1] > 0 else None
    what = "a text model" if text else "a model"
    shown = ", ".join(f"{name} {shape}" for name, shape in inputs.items())
    name = _name_of(Path(spec["path"]))
    return ModelFacts(spec, name, "onnx", f"{what} in ONNX (inputs: {shown})", None, tokenizer, fixed or 128, _vocab(model), inputs)


def _graph_inputs(model: Any) -> list[Any]:
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _vocab(model: Any) -> int | None:
    """The rows of the embedding table input_ids index (a Gather on an initializer), if there is one."""
    sizes = {init.name: list(init.dims) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == "input_ids" and node.input[0] in sizes:
            dims = sizes[node.input[0]]
            return int(dims[0]) if dims else None
    return None


def _hub(repo: str, task: str | None, revision: str | None) -> ModelFacts:
    """A Hub id, found as the workflow's input will be (the cache, or the Hub's listing of the
    commit), its config.json read from the cache or, when only that is missing, fetched alone."""
    try:
        model = hub.locate(repo, revision, "hf", trust_remote_code=False)
        config_file = model.folder / "config.json"
        if not userfiles.exists(config_file):
            config_file = _fetch_config(model)
    except hub.HubProblem as problem:
        where = "--revision" if problem.key == "revision" else WHERE
        prefix = "is not a file or folder here, so it was taken for a Hugging Face Hub id: " if where == WHERE else ""
        raise InputError(
            [
                Problem(
                    where,
                    prefix + problem.message,
                    expected=problem.expected,
                    given=problem.given,
                    hint=problem.hint,
                    file="engine optimize",
                )
            ]
        ) from None
    spec: dict[str, Any] = {"format": "hf", "model": repo, **({"revision": revision} if revision else {})}
    return _from_config(
        _read_config(config_file, repo), spec, plain_name(repo.split("/")[-1]), task, model.folder if model.present else None, repo
    )


def _fetch_config(model: hub.HubModel) -> Path:
    """The config.json of a commit the Hub listed but the cache lacks (the rest is fetched by `engine run`)."""
    import httpx2
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(
            hf_hub_download(model.repo_id, "config.json", revision=model.commit, cache_dir=hub.cache_dir(), etag_timeout=hub.timeout_s())
        )
    except (HfHubHTTPError, httpx2.HTTPError, OSError, ValueError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise hub.HubProblem(
            "model",
            f"its config.json could not be fetched: {first}",
            given=model.repo_id,
            hint=hub.FIX_OFFLINE.format(repo=model.repo_id, revision=""),
        ) from None
