"""Olive's ``data_configs`` → Kiln's ``data``: a dataset per config Kiln can read, the rest listed.

An Olive data config is a container of four components (load_dataset, pre_process_data,
post_process_data, dataloader), each one of Olive's own (``huggingface_dataset``,
``default_dataloader``...) or a function of the config's ``user_script`` that Olive's registry
decorators (``@Registry.register_dataset()``...) name. The function that makes the samples (the
script's dataset, else its dataloader over one of Olive's local datasets) becomes Kiln's ``custom``
data source, which loads the script with a stand-in for those decorators and calls that function by
name when the data is read. The script is read as text here, never run.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from engine.olive.options import NEVER_RUN

COMPONENTS = ("load_dataset_config", "pre_process_data_config", "post_process_data_config", "dataloader_config")
#: the data components olive-ai 0.13 registers itself (olive/data/component): not the user script's
OLIVE_COMPONENTS = frozenset(
    {
        "huggingface_dataset",
        "local_dataset",
        "raw_dataset",
        "dummy_dataset",
        "simple_dataset",
        "image_folder_dataset",
        "transformers_dummy_dataset",
        "transformers_prompt_dummy_dataset",
        "transformers_token_dummy_dataset",
        "default_load_dataset",
        "pre_process",
        "skip_pre_process",
        "default_pre_process_data",
        "huggingface_pre_process",
        "text_generation_huggingface_pre_process",
        "ner_huggingface_preprocess",
        "tokenizer_pre_process",
        "audio_classification_pre_process",
        "speech_transcription_pre_process",
        "vision_vqa_pre_process",
        "post_process",
        "skip_post_process",
        "default_post_process_data",
        "ner_post_process",
        "text_classification_post_process",
        "text_generation_post_process",
        "default_dataloader",
        "no_auto_batch_dataloader",
        "dataloader_with_ignored_batch_fields",
        "default_calibration_dataloader",
        "vision_vqa_dataloader",
    }
)
#: Olive user-script pre-processings of an image dataset (the recipes' names for them)
IMAGE_PRE = frozenset({"image_pre_process", "dataset_pre_process"})
#: words in a Hub dataset's name that say it holds images (a script's pre-processing does not say which)
IMAGE_DATASET_WORDS = ("imagenet", "image", "cifar", "mnist")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the datasets library's builders of local files (data_name csv, json...): not a Hub dataset
FILE_BUILDERS = frozenset({"csv", "json", "text", "parquet", "arrow", "imagefolder", "audiofolder"})
#: Olive's load_dataset components that read local files or make data (not a Hub dataset)
LOCAL_DATASETS = frozenset({"local_dataset", "simple_dataset", "dummy_dataset", "raw_dataset", "default_load_dataset"})


def translate_data(configs: list[Any], ctx: Any) -> None:
    for index, config in enumerate(configs):
        where = ctx.at = f"data_configs[{index}]"
        if not isinstance(config, dict):
            ctx.skip(where, "not a data config object")
            continue
        name = ctx.plain(str(config.get("name", f"data{index}")))
        user = _user_components(config, ctx)
        source = _user_data(config, user, where, ctx) if user else _container(config, where, ctx)
        if source is not None:
            ctx.data[name] = source


def script_functions(path: Path) -> set[str] | None:
    """The names a user script gives its functions, lower-cased (Olive's registry is case-insensitive):
    each function's own name and the name its ``@Registry.register_*("name")`` decorator gives. None when
    the file cannot be read as Python."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.ClassDef):
            continue
        names.add(node.name.lower())
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and decorator.args and isinstance(decorator.args[0], ast.Constant):
                names.add(str(decorator.args[0].value).lower())
            for keyword in decorator.keywords if isinstance(decorator, ast.Call) else []:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    names.add(str(keyword.value.value).lower())
    return names


def _user_components(config: dict[str, Any], ctx: Any) -> dict[str, str]:
    """The components of a data config that are its user_script's functions: component key → function name."""
    script = config.get("user_script")
    if not script:
        return {}
    defined = script_functions(ctx.full(str(script))) if ctx.exists(str(script)) else None
    found: dict[str, str] = {}
    for key in COMPONENTS:
        kind = (config.get(key) or {}).get("type") if isinstance(config.get(key), dict) else None
        if kind and (str(kind).lower() in defined if defined is not None else str(kind).lower() not in OLIVE_COMPONENTS):
            found[key] = str(kind)
    for key, value in config.items():
        if key.endswith("_func") and value:
            found[key] = str(value)
    return found or {"": "its functions"}


def _user_data(config: dict[str, Any], user: dict[str, str], where: str, ctx: Any) -> dict[str, Any] | None:
    """A data config whose user_script makes the samples → Kiln's ``custom`` data source, naming the one
    function it calls (nothing runs until the workflow is run)."""
    script = str(config.get("user_script", ""))
    if not ctx.exists(script) or "" in user:
        ctx.skip(f"{where}.user_script", f"{script}: no data function named, or the file is missing; " + NEVER_RUN)
        return None
    load = config.get("load_dataset_config") or {}
    load_kind = str(load.get("type") or "").lower()
    if "load_dataset_config" in user:
        key = "load_dataset_config"
    elif "dataloader_config" in user and (load_kind in LOCAL_DATASETS or not (load_kind or load.get("data_name"))):
        key = "dataloader_config"
    else:  # the script processes a dataset Kiln does not read (a Hub dataset)
        source = _container(config, where, ctx)
        why = (
            "processes the dataset above, which is not carried over"
            if source is None
            else "the user script's processing of the dataset above: Kiln's source reads and tokenizes its columns itself; "
            "fold anything more into a custom data source"
        )
        for other in user.values():
            ctx.skip(f"{where}: {other}", why)
        return source
    first = user[key]
    for component, other in user.items():
        if component != key:
            ctx.skip(f"{where}: {other}", _fold(component, other, first))
    params = (config.get(key) or {}).get("params") or {}
    options = {k: v for k, v in params.items() if k not in ("data_dir",)}
    ctx.notes.append(
        f"{where}: {script} → Kiln's custom data source, which loads it (Olive's registry decorators provided by a stand-in) "
        f"and runs {first}(model, **options) when the data is read; it returns {{input name: array}} (or that and labels) or a sequence of samples (as an Olive dataset)"
    )
    return {"source": "custom", "file": ctx.locate(script), "function": first, "options": options}


def _fold(component: str, function: str, first: str) -> str:
    if component == "post_process_data_config":
        return (
            f"post-processes the model's outputs for Olive's metrics: Kiln's accuracy evaluator takes it as postprocess "
            f"(file and postprocess_function); the data comes from {first}"
        )
    return f"Kiln's custom data source calls one function: fold {function} into {first}"


def _container(config: dict[str, Any], where: str, ctx: Any) -> dict[str, Any] | None:
    kind = str(config.get("type") or "")
    load = config.get("load_dataset_config") or {}
    pre = config.get("pre_process_data_config") or {}
    if kind == "DummyDataContainer":
        shapes = load.get("input_shapes") or [[1, 128]]
        result = {"source": "synthetic", "samples": int(load.get("max_samples", 32))}
        if len(shapes[0]) > 1:
            result["sequence_length"] = int(shapes[0][1])
        ctx.notes.append(f"{where}: dummy data → synthetic (names, dtypes and shapes are read from the model)")
        return result
    if kind in ("HuggingfaceContainer", "TextGenerationContainer") or (not kind and load.get("data_name")):
        files = load.get("data_files")
        file = files if isinstance(files, str) else (files[0] if isinstance(files, list) and len(files) == 1 else None)
        suffix = Path(str(file)).suffix if file else ""
        if file and ctx.exists(str(file)) and suffix in (".csv", ".json", ".jsonl", ".txt"):
            return _local_file(str(file), suffix, pre, ctx)
        if load.get("data_name") and str(load["data_name"]).lower() not in FILE_BUILDERS:
            return hub_dataset(kind, load, pre, where, ctx, config.get("user_script"))
        ctx.skip(
            f"{where}.load_dataset_config",
            f"the {load.get('data_name') or 'unnamed'} files {files!r} are not beside the config: save them as csv/jsonl/text "
            "and point a data source at them",
        )
        return None
    if kind == "RawDataContainer":
        ctx.skip(f"{where}", "raw binary files: convert them to one .npz (an array per input) and use Kiln's npz source")
        return None
    ctx.skip(f"{where}.type", f"no Kiln data source for Olive's {kind or 'untyped'} container")
    return None


def script_columns(script: Any, ctx: Any) -> list[str]:
    """The dataset columns a recipe's user_script reads of the samples it loops over (``for i, sample
    in enumerate(dataset): ... sample["text"]``: string subscripts of the loop's variable inside the
    loop), in first-read order; none when there is no script or it does not parse. Read with ``ast``,
    never run (Kiln does not run a recipe's data script at import)."""
    if not script or not ctx.exists(str(script)):
        return []
    try:
        tree = ast.parse(ctx.full(str(script)).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    found: dict[str, None] = {}
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For) or "dataset" not in ast.unparse(loop.iter).lower():
            continue
        target = loop.target.elts[-1] if isinstance(loop.target, ast.Tuple) and loop.target.elts else loop.target
        if not isinstance(target, ast.Name):
            continue
        for node in (n for statement in loop.body for n in ast.walk(statement)):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == target.id
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                found.setdefault(node.slice.value, None)
    return list(found)


def hub_dataset(kind: str, load: dict[str, Any], pre: dict[str, Any], where: str, ctx: Any, script: Any = None) -> dict[str, Any] | None:
    """Olive's Hub dataset (load_dataset_config: data_name, subset, split; pre_process_data_config: its columns,
    lengths and sample count) as Kiln's hf_dataset, read from the Hub cache; None (listed) when Kiln cannot
    read its samples (no text column, or text with no Hugging Face tokenizer at hand). A config that
    names no column, under a ``script`` that reads exactly one column of the samples (``script_columns``),
    takes that one as its text column, with a note."""
    name = str(load["data_name"])
    load, pre = {**load, **(load.get("params") or {})}, {**pre, **(pre.get("params") or {})}
    cols = pre.get("input_cols") or pre.get("text_cols") or []
    cols = [cols] if isinstance(cols, str) else list(cols)
    read_by_script = script_columns(script, ctx) if not cols and not pre.get("input_col") else []
    if len(read_by_script) == 1:
        cols = list(read_by_script)
        ctx.notes.append(
            f"{where}: the recipe's script reads the column {cols[0]!r} of each sample of {name}: Kiln tokenizes that column "
            "with the input model's tokenizer (the script's own preprocessing is not run)"
        )
    generation = kind == "TextGenerationContainer" or bool(pre.get("strategy")) or ("text_cols" in pre and not pre.get("input_cols"))
    image_col = pre.get("input_col") or pre.get("image_col")
    images = str(pre.get("type", "")).lower() in IMAGE_PRE and any(word in name.lower() for word in IMAGE_DATASET_WORDS)
    if not cols and not generation and (image_col or images):
        return _hub_images(name, load, pre, str(image_col or "image"), where, ctx)
    if not cols and not generation:
        ctx.skip(
            f"{where}.load_dataset_config",
            f"the Hugging Face Hub dataset {name}: the config names none of its columns (input_cols, input_col) and the recipe's "
            "script picks the samples (Kiln does not run it): give an hf_dataset its text, image or feature column by hand",
        )
        return None
    if ctx.input_format != "hf" and not pre.get("tokenizer"):
        ctx.skip(
            f"{where}.load_dataset_config",
            f"the Hugging Face Hub dataset {name}: its text is tokenized with the input model's tokenizer, and this {ctx.input_format} "
            "input has none: give the hf_dataset `tokenizer: <folder holding the tokenizer>`",
        )
        return None
    result: dict[str, Any] = {"source": "hf_dataset", "name": name}
    if load.get("subset"):
        result["config"] = str(load["subset"])
    result["hf_split"] = str(load.get("split") or "train")
    result["text_column"] = str(cols[0]) if cols else "text"
    _text_options(result, pre, cols, generation, where, ctx)
    if pre.get("max_samples"):
        result["limit"] = int(pre["max_samples"])
    for key in ("streaming", "trust_remote_code"):
        if load.get(key):
            ctx.notes.append(f"{where}.load_dataset_config.{key}: Kiln reads the dataset's files from the Hub cache (no script, no stream)")
    ctx.notes.append(
        f"{where}: the Hugging Face Hub dataset {name} → hf_dataset, read from the Hub cache: fetch it on a connected machine "
        f"with `hf download {name} --repo-type dataset`"
    )
    return result


def _text_options(result: dict[str, Any], pre: dict[str, Any], cols: list[Any], generation: bool, where: str, ctx: Any) -> None:
    """hf_dataset's text options from Olive's pre-processing: joined windows for a generation dataset,
    else a text (or a pair) per row with its label and lengths."""
    if generation:
        strategy = str(pre.get("strategy") or "join")
        result["join"] = strategy.startswith("join")
        result["max_length"] = int(pre.get("max_seq_len") or pre.get("max_length") or 1024)
        if strategy == "join-random":
            ctx.notes.append(
                f"{where}: Olive's join-random strategy draws random windows of the joined text; Kiln's join takes them in order"
            )
        elif not result["join"]:
            ctx.notes.append(f"{where}: Olive's {strategy} strategy → one sample per row, padded to max_length")
    else:
        if len(cols) > 1:
            result["text_pair_column"] = str(cols[1])
        if len(cols) > 2:
            ctx.skip(f"{where}.pre_process_data_config.input_cols", f"{cols[2:]}: Kiln tokenizes a text or a pair of texts")
        if pre.get("label_col"):
            result["label_column"] = str(pre["label_col"])
        if pre.get("max_length") or pre.get("max_seq_len"):
            result["max_length"] = int(pre.get("max_length") or pre["max_seq_len"])
        if pre.get("padding") in ("max_length", "longest"):
            result["padding"] = pre["padding"]


def _hub_images(name: str, load: dict[str, Any], pre: dict[str, Any], column: str, where: str, ctx: Any) -> dict[str, Any]:
    """A Hub dataset of images (ImageNet-like, pre-processed by the recipe's script) as hf_dataset's
    image_column: 224 x 224, ImageNet's mean and std, fed to the model's first input."""
    shapes = ctx.export.get("input_shapes") or {}
    result: dict[str, Any] = {
        "source": "hf_dataset",
        "name": name,
        **({"config": str(load["subset"])} if load.get("subset") else {}),
        "hf_split": str(load.get("split") or "train"),
        "image_column": column,
        "size": [224, 224],
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
        "input_name": next(iter(shapes), "pixel_values"),
    }
    if pre.get("label_col"):
        result["label_column"] = str(pre["label_col"])
    samples = pre.get("max_samples") or (pre.get("size") if str(pre.get("type", "")).lower() == "dataset_pre_process" else None)
    if isinstance(samples, int) and samples > 0:
        result["limit"] = samples
    ctx.notes.append(
        f"{where}: the Hugging Face Hub dataset {name} → hf_dataset's image_column, read from the Hub cache (`hf download {name} "
        "--repo-type dataset`); the recipe's image transforms (and any label remapping) are approximated: resized to 224 x 224, "
        f"ImageNet's mean and std, fed to input '{result['input_name']}': check them against the model's"
    )
    return result


def _local_file(file: str, suffix: str, pre: dict[str, Any], ctx: Any) -> dict[str, Any]:
    path = ctx.locate(file)
    if suffix == ".txt":
        result: dict[str, Any] = {"source": "text_lines", "path": path, "tokenizer": "input"}
    else:
        result = {"source": "csv" if suffix == ".csv" else "jsonl", "path": path}
        cols = pre.get("input_cols") or []
        if cols:
            result["text_column"] = cols[0]
        if pre.get("label_col"):
            result["label_column"] = pre["label_col"]
    if pre.get("max_length") or pre.get("max_seq_len"):
        result["max_length"] = int(pre.get("max_length") or pre["max_seq_len"])
    if pre.get("max_samples"):
        result["split"] = {"take": "first", "count": int(pre["max_samples"])}
    return result
