"""The reference model's outputs on a dataset, computed once per (reference, target, feeds) and
kept in the evaluation cache folder, so judging 20 candidates against one FP32 model runs that
model once instead of 20 times.

An entry is ``<key>.npz`` (the arrays, one per batch and output) plus ``<key>.json`` (the key
document, the output specs, and the sha256 of the npz bytes). The key covers the reference's
digest, the target's fingerprint (runtime, providers, options, library versions: outputs differ
between execution providers) and a hash of every feed array the reference is given, so a changed
dataset, tokenizer or batch size is a different entry. The json is written last, atomically;
the npz is hashed before it is served, and an entry that does not check out is a miss (and is
overwritten). Results larger than ``MAX_BYTES`` are not kept: the evaluator then streams as
before. numpy is imported inside functions: evaluator modules import this one at validate time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.hashing import sha256_file, sha256_json

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

#: reference outputs above this size are recomputed per candidate rather than cached
MAX_BYTES = 512 * 1024 * 1024
SCHEME = "kiln-reference-outputs-1"


def feeds_digest(batches: Iterable[dict[str, np.ndarray]]) -> str:
    """sha256 over every feed array (name, dtype, shape, bytes), batch by batch."""
    import numpy as np

    digest = hashlib.sha256()
    for index, feeds in enumerate(batches):
        for name in sorted(feeds):
            array = np.ascontiguousarray(feeds[name])
            digest.update(f"{index}:{name}:{array.dtype.str}:{list(array.shape)}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


class ReferenceOutputs:
    """One cache entry: per batch, the reference's outputs by name."""

    def __init__(self, cache_dir: Path | None, key_doc: dict[str, Any]) -> None:
        self.key_doc = {"scheme": SCHEME, **key_doc}
        self.key = sha256_json(self.key_doc)
        self.cache_dir = cache_dir
        self.status = "disabled" if cache_dir is None else "miss"

    def _paths(self) -> tuple[Path, Path]:
        assert self.cache_dir is not None
        return self.cache_dir / f"{self.key}.npz", self.cache_dir / f"{self.key}.json"

    def load(self) -> tuple[list[str], list[dict[str, np.ndarray]]] | None:
        """The cached output names and per-batch outputs, or None (a miss, or a damaged entry)."""
        if self.cache_dir is None:
            return None
        import numpy as np

        arrays_path, meta_path = self._paths()
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key_doc") != self.key_doc or sha256_file(arrays_path) != meta.get("npz_sha256"):
                raise ValueError("the entry does not match its key or its checksum")
            with np.load(arrays_path, allow_pickle=False) as archive:
                batches = [{name: archive[f"{index}/{name}"] for name in meta["names"]} for index in range(meta["batches"])]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            logger.warning("reference outputs cache entry %s is damaged (%s): recomputing it", self.key[:12], error)
            self.status = "corrupt"
            return None
        self.status = "hit"
        return list(meta["names"]), batches

    def save(self, names: list[str], batches: list[dict[str, np.ndarray]]) -> None:
        """Write the entry atomically (npz, then the json that vouches for it); best effort."""
        if self.cache_dir is None:
            return
        import numpy as np

        size = sum(array.nbytes for outputs in batches for array in outputs.values())
        if size > MAX_BYTES:
            self.status = "too large"
            return
        arrays_path, meta_path = self._paths()
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with _atomic(arrays_path) as tmp:
                with open(tmp, "wb") as handle:
                    np.savez(
                        handle, **{f"{index}/{name}": array for index, outputs in enumerate(batches) for name, array in outputs.items()}
                    )
            meta = {"key_doc": self.key_doc, "names": names, "batches": len(batches), "npz_sha256": sha256_file(arrays_path)}
            with _atomic(meta_path) as tmp:
                tmp.write_text(json.dumps(meta, sort_keys=True))
        except OSError as error:  # a full disk costs the cache, never the evaluation
            logger.warning("could not cache the reference outputs (%s)", error)


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
