"""Turn a Kiln input model into something an exporter can trace.

A Hugging Face folder or a PyTorch factory becomes an ``ExportSource``: a module called with
positional tensors that returns a tuple of tensors, example inputs, a second example at other
batch / sequence sizes (to check that dynamic axes really are dynamic) and the axes that may vary.

Imported by ``torch_export`` only when the pass runs: torch is heavy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.core import ModelArtifact

#: the inputs a text encoder may take, in the order the exported model lists them
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_OUTPUTS = {"feature-extraction": ("last_hidden_state",), "text-classification": ("logits",)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: example sizes: (batch, sequence) of the export example and of the second example
EXAMPLE_SIZES = ((2, 16), (1, 9))
EXAMPLE_TEXTS = (
    "Kiln exports this sentence.",
    "A second sentence, longer than the first one, so that the first is padded.",
)
#: how hf_source loads a folder: in float32, from its own files (never the Hub), saying which weights were missing
LOAD_OPTIONS: dict[str, Any] = {"dtype": torch.float32, "local_files_only": True, "output_loading_info": True}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


class KeywordCall(torch.nn.Module):
    """Call ``model`` with its inputs by keyword and return its outputs as a flat tuple.

    transformers 5's ``BertModel.forward`` rejects positional arguments under the TorchScript
    tracer, and exporters want a tuple of tensors, not a ``ModelOutput``.
    """

    def __init__(self, model: torch.nn.Module, input_names: list[str], output_keys: list[str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)
        self.output_keys = tuple(output_keys) if output_keys is not None else None

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        result = self.model(**dict(zip(self.input_names, tensors, strict=True)))
        if isinstance(result, torch.Tensor):
            return (result,)
        if isinstance(result, Mapping):
            keys = self.output_keys if self.output_keys is not None else tensor_keys(result)
            return tuple(result[key] for key in keys)
        return tuple(result)


@dataclass
class ExportSource:
    module: torch.nn.Module
    input_names: list[str]
    output_names: list[str]
    example: dict[str, torch.Tensor]
    #: the same inputs at other batch (and sequence) sizes
    alternate: dict[str, torch.Tensor]
    #: input name -> {axis: axis name} for the axes that may vary
    input_axes: dict[str, dict[int, str]]
    #: axis name -> (size in ``example``, size in ``alternate``)
    axis_sizes: dict[str, tuple[int, int]]
    notes: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)


def tensor_keys(result: Mapping[str, Any]) -> list[str]:
    return [key for key, value in result.items() if isinstance(value, torch.Tensor)]


# --- Hugging Face folders -------------------------------------------------------------------


def remote_code(model: ModelArtifact) -> bool:
    """Whether the workflow lets transformers run the Python files of the model's folder
    (``input.trust_remote_code: true``, carried in the model's attrs)."""
    return model.attrs.get("trust_remote_code") is True


#: the transformers auto class that loads a model for each task Kiln exports (optimum's task names)
AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
    "object-detection": "AutoModelForObjectDetection",
    "semantic-segmentation": "AutoModelForSemanticSegmentation",
}


def hf_source(
    folder: Path, task: str, attn_implementation: str, outputs: tuple[str, ...] | None, trust_remote_code: bool = False
) -> ExportSource:
    """Load a Hugging Face folder for ``task`` with deterministic initialization of missing weights
    (with the folder's own code only when ``trust_remote_code``): a text model takes its tokenizer's
    inputs, a vision model (``main_input_name`` pixel_values) one image batch."""
    model, notes = _load_model(folder, task, attn_implementation, trust_remote_code)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        return _vision_source(model, folder, task, outputs, notes)
    if task not in DEFAULT_OUTPUTS:
        raise ValueError(f"task {task} takes images, and this {type(model).__name__} takes {model.main_input_name}")
    tokenizer = _load_tokenizer(folder, trust_remote_code)

    accepted = set(inspect.signature(model.forward).parameters)
    wanted = set(tokenizer.model_input_names) if tokenizer is not None else set(TEXT_INPUTS)
    input_names = [name for name in TEXT_INPUTS if name in accepted and name in wanted]
    if "input_ids" not in input_names:
        raise ValueError(f"the model's forward takes no input_ids (or its tokenizer does not produce them); it takes {sorted(accepted)}")
    if tokenizer is not None:
        example, alternate = (_tokenized(tokenizer, input_names, batch, seq) for batch, seq in EXAMPLE_SIZES)
    else:
        notes.append("no tokenizer in the folder: the example inputs are random token ids")
        vocab = int(getattr(model.config, "vocab_size", 100))
        example, alternate = (_random_text(input_names, vocab, batch, seq) for batch, seq in EXAMPLE_SIZES)
    keys = _output_keys(model, example, outputs, DEFAULT_OUTPUTS[task], task)

    attrs: dict[str, Any] = {"task": task}
    if tokenizer is not None:
        attrs["tokenizer"] = str(folder)
    return ExportSource(
        module=KeywordCall(model, input_names, keys).eval(),
        input_names=input_names,
        output_names=keys,
        example=example,
        alternate=alternate,
        input_axes={name: {0: "batch", 1: "sequence"} for name in input_names},
        axis_sizes={"batch": (EXAMPLE_SIZES[0][0], EXAMPLE_SIZES[1][0]), "sequence": (EXAMPLE_SIZES[0][1], EXAMPLE_SIZES[1][1])},
        notes=notes,
        attrs=attrs,
    )


def _load_model(folder: Path, task: str, attn_implementation: str, trust_remote_code: bool) -> tuple[Any, list[str]]:
    """The model ``AUTO_CLASSES[task]`` loads from ``folder``, in eval mode, and what to note of it."""
    import transformers  # heavy (seconds): only Hugging Face inputs need it

    auto = AUTO_CLASSES[task]
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a pass never prints
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model, loading = getattr(transformers, auto).from_pretrained(
                str(folder), attn_implementation=attn_implementation, trust_remote_code=trust_remote_code, **LOAD_OPTIONS
            )
    except ValueError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"transformers' {auto} cannot load this model for task {task}: {first}") from error
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    model.eval()
    missing = sorted(loading.get("missing_keys") or [])
    notes = [f"weights missing from the checkpoint, initialized with seed 0: {', '.join(missing)}"] if missing else []
    return model, notes


def _output_keys(
    model: Any, example: dict[str, torch.Tensor], outputs: tuple[str, ...] | None, default: tuple[str, ...], task: str
) -> list[str]:
    """The outputs to export: those asked for, else the task's; each must be one the model returns."""
    with torch.no_grad():
        available = tensor_keys(model(**example))
    keys = list(outputs) if outputs else list(default)
    unknown = [key for key in keys if key not in available]
    if unknown:
        raise ValueError(f"outputs {unknown} are not outputs of this {task} model; it returns {available}")
    return keys


def _vision_source(model: Any, folder: Path, task: str, outputs: tuple[str, ...] | None, notes: list[str]) -> ExportSource:
    """A model that takes ``pixel_values``: one image batch of the processor's (or config's) size, batch dynamic."""
    from passes.export import vision

    if task not in vision.DEFAULT_OUTPUTS:
        raise ValueError(
            f"task {task} takes text, and this {type(model).__name__} takes pixel_values: set task to one of {sorted(vision.DEFAULT_OUTPUTS)}"
        )
    shape, where = vision.image_shape(folder, model.config)
    notes.append(f"pixel_values of {list(shape)} per image (from {where}), batch dynamic")
    example, alternate = vision.examples(shape)
    keys = _output_keys(model, example, outputs, vision.DEFAULT_OUTPUTS[task], task)
    return ExportSource(
        module=KeywordCall(model, ["pixel_values"], keys).eval(),
        input_names=["pixel_values"],
        output_names=keys,
        example=example,
        alternate=alternate,
        input_axes={"pixel_values": {0: "batch"}},
        axis_sizes={"batch": vision.BATCHES},
        notes=notes,
        attrs=vision.vision_attrs(folder, task, shape),
    )


def _load_tokenizer(folder: Path, trust_remote_code: bool) -> Any:
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        return None
    import transformers  # already loaded by _load_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
    return tokenizer if tokenizer.pad_token is not None else None


def _tokenized(tokenizer: Any, input_names: list[str], batch: int, seq: int) -> dict[str, torch.Tensor]:
    encoded = tokenizer(list(EXAMPLE_TEXTS[:batch]), padding="max_length", truncation=True, max_length=seq, return_tensors="pt")
    return {name: encoded[name].to(torch.int64) for name in input_names}


def _random_text(input_names: list[str], vocab: int, batch: int, seq: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seq)
    tensors = {
        "input_ids": torch.randint(0, vocab, (batch, seq), generator=generator, dtype=torch.int64),
        "attention_mask": torch.ones(batch, seq, dtype=torch.int64),
        "token_type_ids": torch.zeros(batch, seq, dtype=torch.int64),
    }
    tensors["attention_mask"][0, seq - seq // 4 :] = 0  # padding, so the mask matters
    return {name: tensors[name] for name in input_names}


# --- PyTorch factories ----------------------------------------------------------------------


def factory_source(
    artifact: ModelArtifact, input_shapes: dict[str, tuple[int, ...]] | None, input_dtypes: dict[str, str], outputs: tuple[str, ...] | None
) -> ExportSource:
    """Build the module with its factory; examples come from the factory or from ``input_shapes``."""
    made = call_factory(artifact)
    function = factory_spec(artifact)[1]
    if isinstance(made, torch.nn.Module):
        module, example = made, None
    elif isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        module, example = made
    else:
        raise ValueError(f"{function}() must return an nn.Module or (nn.Module, example_inputs), got {type(made).__name__}")
    module.eval()

    if example is None:
        if not input_shapes:
            raise ValueError(f"{function}() returns no example inputs: set the option input_shapes (name -> shape)")
        example = _example_from_shapes(input_shapes, input_dtypes)
    elif input_shapes:
        raise ValueError(f"{function}() returns example inputs: remove the option input_shapes, one source of inputs is enough")
    if not isinstance(example, Mapping) or not all(isinstance(v, torch.Tensor) for v in example.values()):
        raise ValueError(f"{function}() must return example inputs as a dict of name -> tensor")
    example = dict(example)
    _check_forward_accepts(module, list(example))

    with torch.no_grad():
        result = module(**example)
    keys = None
    if isinstance(result, torch.Tensor):
        names = ["output"]
    elif isinstance(result, Mapping):
        keys = list(outputs) if outputs else tensor_keys(result)
        names = list(keys)
        unknown = [key for key in keys if key not in tensor_keys(result)]
        if unknown:
            raise ValueError(f"outputs {unknown} are not outputs of the model; it returns {tensor_keys(result)}")
    else:
        names = [f"output_{i}" for i in range(len(result))]
    if outputs and keys is None:
        if len(outputs) != len(names):
            raise ValueError(f"the model returns {len(names)} outputs but the option outputs names {len(outputs)}")
        names = list(outputs)

    batch = next(iter(example.values())).shape[0] if next(iter(example.values())).dim() else 1
    return ExportSource(
        module=KeywordCall(module, list(example), keys).eval(),
        input_names=list(example),
        output_names=names,
        example=example,
        alternate={name: torch.cat([t, t[:1]]) if t.dim() else t for name, t in example.items()},
        input_axes={name: {0: "batch"} for name, t in example.items() if t.dim()},
        axis_sizes={"batch": (batch, batch + 1)},
        attrs={"function": function},
    )


def call_factory(artifact: ModelArtifact) -> Any:
    """What the factory of a ``torch`` artifact returns, called with its kwargs under a fixed torch
    seed (the caller's random state is left as it was)."""
    file, function, kwargs = factory_spec(artifact)
    factory = getattr(_load_file(file), function, None)
    if not callable(factory):
        raise ValueError(f"{file} defines no function '{function}'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return factory(**kwargs)


def factory_spec(artifact: ModelArtifact) -> tuple[Path, str, dict[str, Any]]:
    """(python file, function name, kwargs): from ``attrs`` when ``path`` is the file, or from
    ``factory.json`` ({"file", "function", "kwargs"}) when ``path`` is a folder."""
    path = Path(artifact.path)
    if path.is_dir():
        spec_file = path / "factory.json"
        if not spec_file.exists():
            raise ValueError(f"a torch model folder must hold factory.json; {path} does not")
        spec = json.loads(spec_file.read_text())
        return path / spec.get("file", "model.py"), str(spec["function"]), dict(spec.get("kwargs") or {})
    function = artifact.attrs.get("function")
    if not function:
        raise ValueError("a torch model needs attrs['function']: the name of the factory function in its file")
    return path, str(function), dict(artifact.attrs.get("kwargs") or {})


def _load_file(file: Path) -> Any:
    if not file.is_file():
        raise ValueError(f"the factory file {file} does not exist")
    source = file.read_bytes()
    name = "kiln_factory_" + hashlib.sha256(str(file.resolve()).encode() + source).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(file.parent))  # so the factory may import its sibling modules
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.parent))
    return module


def _example_from_shapes(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]) -> dict[str, torch.Tensor]:
    unknown = sorted(set(dtypes) - set(shapes))
    if unknown:
        raise ValueError(f"input_dtypes names inputs {unknown} that input_shapes does not list")
    generator = torch.Generator().manual_seed(0)
    example = {}
    for name, shape in shapes.items():
        dtype = DTYPES[dtypes.get(name, "float32")]
        if dtype.is_floating_point:
            example[name] = torch.randn(*shape, generator=generator).to(dtype)
        else:  # integer and boolean inputs get 0 / 1 values: return examples from the factory for others
            example[name] = torch.randint(0, 2, tuple(shape), generator=generator).to(dtype)
    return example


def _check_forward_accepts(module: torch.nn.Module, names: list[str]) -> None:
    parameters = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = [name for name in names if name not in parameters]
    if unknown:
        raise ValueError(f"the module's forward takes no input named {unknown}; its parameters are {list(parameters)}")
