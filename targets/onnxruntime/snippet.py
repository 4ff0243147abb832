"""The program that opens a chosen model the way it was measured (``OnnxRuntimeTarget.snippet``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from targets.onnxruntime.eps import CPU
from targets.onnxruntime.placement import providers_to_create


def ort_snippet(settings: dict[str, Any], model_path: str) -> str:
    """The program ``OnnxRuntimeTarget.snippet`` returns (see there)."""
    options = settings.get("session_options") or {}
    lines = ["import onnxruntime as ort", "", "options = ort.SessionOptions()"]
    for name in ("intra_op_num_threads", "inter_op_num_threads"):
        if options.get(name) is not None:
            lines.append(f"options.{name} = {int(options[name])}")
    lines.append(f"options.execution_mode = ort.ExecutionMode.{options.get('execution_mode', 'ORT_SEQUENTIAL')}")
    lines.append(
        f"options.graph_optimization_level = ort.GraphOptimizationLevel.{options.get('graph_optimization_level', 'ORT_ENABLE_ALL')}"
    )
    for name in ("enable_cpu_mem_arena", "enable_mem_pattern"):
        if options.get(name) is False:
            lines.append(f"options.{name} = False")
    for key, value in (options.get("config_entries") or {}).items():
        lines.append(f"options.add_session_config_entry({key!r}, {str(value)!r})")
    recorded = list(settings.get("providers") or [CPU])
    providers = providers_to_create(recorded, options.get("config_entries"))
    given = list(settings.get("provider_options") or [{} for _ in recorded])
    provider_options = [given[recorded.index(name)] for name in providers]
    if settings.get("store_paths"):
        lines.append(f"# {', '.join(settings['store_paths'])}: folders in Kiln's store; point them at your own")
    lines += [
        f"providers = {providers!r}",
        f"provider_options = {provider_options!r}",
    ]
    bind = settings.get("io_binding") or {}
    loop = settings.get("decode_loop")
    if loop and loop.get("loop") == "seq2seq":  # model_path is the folder's seq2seq.json, which names the parts
        folder = str(Path(model_path).parent)
        lines += [
            f"{part} = ort.InferenceSession({str(Path(folder) / f'{part}.onnx')!r}, options, providers=providers, provider_options=provider_options)"
            for part in ("encoder", "decoder")
        ]
        lines += [
            "",
            "# an encoder-decoder (seq2seq.json names each part's inputs and outputs), measured with a greedy loop: the encoder",
            f"# once, then the decoder per token ({loop.get('kv_cache')}); the loop is targets/onnxruntime/seq2seq.py",
        ]
        return "\n".join(lines) + "\n"
    lines.append(f"session = ort.InferenceSession({model_path!r}, options, providers=providers, provider_options=provider_options)")
    if loop:
        lines += [
            "",
            f"# a decoder, measured with a greedy decode loop ({loop.get('loop')}; key/value cache: {loop.get('kv_cache')}):",
            "# names and cache shapes are in the folder's genai_config.json; the loop is targets/onnxruntime/decoder.py",
        ]
    elif bind.get("mode") in ("device", "host"):
        lines += _binding_lines(str(bind.get("device") or "cpu"), settings.get("cuda_graph") is not None)
    else:
        lines += ["", "# outputs = session.run(None, {input name: numpy array})"]
    return "\n".join(lines) + "\n"


def _binding_lines(device: str, graph: bool) -> list[str]:
    """The run function of a bound session: one binding (and CUDA graph) per input shape."""
    name, _, index = device.partition(":")
    return [
        "",
        f"# I/O binding on {device}: inputs copied there once per shape and updated in place, outputs reused",
        *(["# static shapes: a CUDA graph is captured per input shape (run option gpu_graph_id)"] if graph else []),
        "# run(feeds) returns the bound output OrtValues where they are (no copy: as Kiln measured it); the next run",
        "# of the same input shapes overwrites them. run(feeds, returns='torch'): torch tensors sharing them (DLPack);",
        "# run(feeds, returns='numpy'): copies in host memory.",
        "bindings = {}",
        "",
        "",
        "def run(feeds, returns='ortvalue'):",
        "    if returns not in ('ortvalue', 'torch', 'numpy'):",
        "        raise ValueError(f\"returns must be 'ortvalue', 'torch' or 'numpy', got {returns!r}\")",
        "    key = tuple(sorted((name, array.shape) for name, array in feeds.items()))",
        "    if key not in bindings:",
        "        binding = session.io_binding()",
        f"        inputs = {{n: ort.OrtValue.ortvalue_from_numpy(a.copy(), {name!r}, {int(index or 0)}) for n, a in feeds.items()}}",
        "        for n, value in inputs.items():",
        "            binding.bind_ortvalue_input(n, value)",
        "        for output in session.get_outputs():",
        f"            binding.bind_output(output.name, {name!r}, {int(index or 0)})",
        "        first = ort.RunOptions()",
        *(['        first.add_run_config_entry("gpu_graph_id", "-1")  # allocate the outputs outside any graph'] if graph else []),
        "        session.run_with_iobinding(binding, first)  # tells the outputs' shapes",
        "        described = [(value.shape(), value.numpy().dtype) for value in binding.get_outputs()]",
        "        outputs = []",
        "        for output, (shape, dtype) in zip(session.get_outputs(), described):",
        f"            mine = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, {name!r}, {int(index or 0)})",
        "            binding.bind_ortvalue_output(output.name, mine)",
        "            outputs.append(mine)",
        "        run_options = ort.RunOptions()",
        *(['        run_options.add_run_config_entry("gpu_graph_id", str(len(bindings) + 1))'] if graph else []),
        "        bindings[key] = (binding, inputs, outputs, run_options)",
        "    else:",
        "        for n, array in feeds.items():",
        "            bindings[key][1][n].update_inplace(array)",
        "    binding, _, outputs, run_options = bindings[key]",
        "    session.run_with_iobinding(binding, run_options)",
        "    if returns == 'numpy':",
        "        return [value.numpy().copy() for value in outputs]",
        "    if returns == 'torch':",
        "        import torch",
        "",
        "        return [torch.from_dlpack(value) for value in outputs]",
        "    return list(outputs)",
    ]
