"""One NNCF calibration for the passes that ask for the same quantization.

``nncf_quantize`` and ``nncf_quantize_accuracy`` with the same options start from the same
quantization: ``nncf.quantize_with_accuracy_control`` first quantizes exactly as ``nncf.quantize``
does (weights left in float while it may revert ops), then measures. Calibration is most of each
pass (on all-MiniLM-L6-v2, 128 samples: 21 s of the 25 s accuracy control took when it reverted
nothing), and a workflow that tries plain INT8 beside accuracy-controlled INT8 paid it twice.

Both passes run NNCF's OpenVINO ``quantize_impl`` through :func:`shared`, which keeps its result
(weights uncompressed, as accuracy control asks for it) in the store's pass cache
(``passcache/nncf-quantized/<key>``), keyed by the input model's digest, every calibration sample
the dataset holds, every option NNCF was given, and the versions of nncf and openvino. Then:

- accuracy control gets that model as its own call would have made it;
- the plain pass gets it with its weights compressed to INT8 and NNCF's record of the options
  written as ``nncf.quantize`` writes them, the same steps ``nncf.quantize`` takes after
  calibrating: the same bytes as a calibration of its own (``tests/passes/test_nncf_shared.py``).

An entry is written to a scratch folder and renamed into place whole, with its digest beside it;
one whose files no longer give that digest is calibrated again, never served. Two jobs that need
one key at once take turns (an ``flock`` on ``<key>.lock``): the second reads what the first
wrote instead of calibrating beside it on the same cores. NNCF's own statistics cache
(``statistics_path``) serves weight compression only, not ``nncf.quantize``: hence this one.
"""

from __future__ import annotations

import fcntl
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from engine.core import sha256_json
from passes.common import cached_folder

FOLDER = "nncf-quantized"


@dataclass
class Sharing:
    """What :func:`shared` did: the entries it served from the cache and those it calibrated."""

    served: list[str] = field(default_factory=list)
    calibrated: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        notes = [
            f"NNCF's calibration from the store's pass cache ({key[:12]}): the same options and samples were calibrated before"
            for key in self.served
        ]
        return notes + [
            f"NNCF's calibration kept in the store's pass cache ({key[:12]}) for the passes that ask for it again"
            for key in self.calibrated
        ]


_active = threading.local()  # the block of `shared` this thread is in: (cache root, model digest, Sharing)
_install_lock = threading.Lock()
_original: Any = None  # NNCF's own quantize_impl, once replaced


@contextmanager
def shared(cache_dir: Path | None, model_digest: str) -> Iterator[Sharing]:
    """Within the block, NNCF's OpenVINO quantizations of the model whose artifact digest is
    ``model_digest`` go through the pass cache under ``cache_dir``'s parent (None: no cache, NNCF
    as it is). NNCF's ``quantize_impl`` is replaced once per process by one that, outside such a
    block (or in another thread), is NNCF's own: passes run side by side in threads never see
    each other's cache or a function put back out of turn."""
    sharing = Sharing()
    if cache_dir is None:
        yield sharing
        return
    _install()
    _active.block = (Path(cache_dir).parent / FOLDER, model_digest, sharing)
    try:
        yield sharing
    finally:
        _active.block = None


def _install() -> None:
    global _original
    import nncf.openvino.quantization.quantize_model as backend

    with _install_lock:
        if _original is None:
            _original = backend.quantize_impl
            backend.quantize_impl = _dispatch


def _dispatch(model: ov.Model, calibration_dataset: Any, **options: Any) -> ov.Model:
    block = getattr(_active, "block", None)
    if block is None:
        return _original(model, calibration_dataset, **options)
    root, model_digest, sharing = block
    return _quantize(_original, root, model_digest, sharing, model, calibration_dataset, options)


def _quantize(
    original: Any, root: Path, model_digest: str, sharing: Sharing, model: ov.Model, dataset: Any, options: dict[str, Any]
) -> ov.Model:
    from nncf.openvino.graph.model_utils import remove_friendly_name_duplicates
    from nncf.openvino.quantization.backend_parameters import BackendParameters, is_weight_compression_needed
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    asked = options.get("advanced_parameters") or AdvancedQuantizationParameters()
    uncompressed = deepcopy(asked)
    uncompressed.backend_params[BackendParameters.COMPRESS_WEIGHTS] = False
    remove_friendly_name_duplicates(model)  # what quantize_impl does first: the input model is renamed in place either way
    key = _key(model_digest, dataset, _bound(original, {**options, "advanced_parameters": uncompressed}))
    folder = root / key
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        quantized = _served(folder)
        if quantized is not None:
            sharing.served.append(key)
        else:
            quantized = original(model, dataset, **{**options, "advanced_parameters": uncompressed})
            _keep(quantized, folder)
            sharing.calibrated.append(key)
    if is_weight_compression_needed(asked):
        _as_plain_quantize_writes(quantized, options, asked)
    return quantized


def _as_plain_quantize_writes(quantized: ov.Model, options: dict[str, Any], asked: Any) -> None:
    """What NNCF's ``native_quantize_impl`` does after calibrating when weights are compressed:
    the weights to INT8, then its record of the options it was given."""
    from nncf.openvino.rt_info import dump_parameters
    from nncf.quantization.advanced_parameters import convert_to_dict_recursively
    from openvino._offline_transformations import compress_quantize_weights_transformation

    compress_quantize_weights_transformation(quantized)
    target_device = options.get("target_device")
    dump_parameters(
        quantized,
        {
            "preset": options.get("preset"),
            "target_device": getattr(target_device, "value", target_device),
            "subset_size": options.get("subset_size"),
            "fast_bias_correction": options.get("fast_bias_correction"),
            "model_type": options.get("model_type"),
            "ignored_scope": options.get("ignored_scope"),
            "advanced_parameters": convert_to_dict_recursively(asked),
        },
    )


def _bound(function: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``function``'s defaults for those not given: ``nncf.quantize`` passes
    ``mode=None`` where accuracy control leaves it out, the same quantization."""
    import inspect

    bound = inspect.signature(function).bind_partial(**options)
    bound.apply_defaults()
    return {name: value for name, value in bound.arguments.items() if name not in ("model", "calibration_dataset")}


def _key(model_digest: str, dataset: Any, options: dict[str, Any]) -> str:
    import nncf
    from nncf.quantization.advanced_parameters import convert_to_dict_recursively

    samples = []
    for item in dataset.get_data():
        arrays = item.items() if isinstance(item, dict) else enumerate(item if isinstance(item, list | tuple) else [item])
        samples.append(sha256_json([[str(name), str(a.dtype), list(a.shape), _bytes_digest(a)] for name, a in arrays]))
    described = {
        name: convert_to_dict_recursively(value) if name == "advanced_parameters" else repr(value)
        for name, value in sorted(options.items())
    }
    versions = {"nncf": nncf.__version__, "openvino": ov.get_version()}
    return sha256_json({"model": model_digest, "samples": samples, "options": described, "versions": versions})[:32]


def _bytes_digest(array: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _served(folder: Path) -> ov.Model | None:
    """The kept model, if ``folder`` holds one whose files still give the digest beside it."""
    if not (folder / "model.xml").is_file() or not cached_folder.checked(folder, "openvino"):
        return None
    return ov.Core().read_model(folder / "model.xml")


def _keep(quantized: ov.Model, folder: Path) -> None:
    """``quantized`` saved as it is (float weights uncompressed, never halved) under ``folder``,
    renamed into place whole, its digest written beside it last."""
    cached_folder.keep(folder, "openvino", lambda staged: ov.save_model(quantized, staged / "model.xml", compress_to_fp16=False))
