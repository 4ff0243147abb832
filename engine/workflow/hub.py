"""Models on the Hugging Face Hub as workflow inputs (``input.model: ORG/NAME``).

A Hub model is found in huggingface_hub's own cache (``<cache>/models--ORG--NAME``: ``refs/<branch
or tag>`` naming a commit, ``snapshots/<commit>/`` holding the files). The cache folder and offline
mode are read from the environment when asked (HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub; HF_HUB_OFFLINE), not when huggingface_hub was imported.

``locate`` never downloads a weight: online it asks the Hub which commit the revision names and
which files that commit holds (one metadata request, a short timeout; a Hub that cannot be reached
is offline), offline it reads the cache alone. ``download`` fetches what Kiln uses of one commit
(config, tokenizer, weights: safetensors, else PyTorch .bin; the .py files only with
trust_remote_code) and is called by ``engine run`` only.

A token is huggingface_hub's business: it reads HF_TOKEN (or the token ``hf auth login`` stored)
for each request. Kiln never reads, passes or writes one, and refuses one written in a workflow.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

COMMIT = re.compile(r"[0-9a-f]{40}")
#: a Hugging Face user access token: hf_ and 34 letters and digits (older ones: api_...)
TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}")
#: input keys that would hold a token (huggingface_hub's and transformers' argument names)
TOKEN_KEYS = ("token", "hf_token", "use_auth_token", "auth_token", "huggingface_token")
DEFAULT_REVISION = "main"
#: seconds a metadata request may take (HF_HUB_ETAG_TIMEOUT overrides): validate must not hang
METADATA_TIMEOUT_S = 5.0
METADATA_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")  # config, tokenizer, sentencepiece
ONNX_SUFFIXES = (".onnx", ".onnx_data", ".onnx.data", ".data")  # a graph and its external data
FIX_OFFLINE = (
    "download it where the Hub is reachable: `hf download {repo}{revision}` (or huggingface-cli download), "
    "or point HF_HOME / HF_HUB_CACHE at a cache holding it, or use `path:` for a local folder"
)


class HubProblem(Exception):
    """What is wrong with a Hub input: ``key`` is the input key to blame (model, revision)."""

    def __init__(self, key: str, message: str, given: str, expected: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.key, self.message, self.given, self.expected, self.hint = key, message, given, expected, hint


@dataclass(frozen=True)
class HubModel:
    """A Hub model resolved to one commit, and where the cache holds (or will hold) it."""

    repo_id: str
    revision: str  # as the workflow asks (a branch, a tag or a commit)
    commit: str  # the commit it names: recorded in workflow.lock.json, part of the input's key
    folder: Path  # the commit's snapshot folder in the cache (absent until downloaded)
    files: tuple[str, ...]  # the files of it Kiln uses, relative to ``folder``
    present: bool  # the cache holds them all: nothing to download
    note: str | None = None  # what `engine validate` and `engine plan` tell about it

    @property
    def code(self) -> tuple[str, ...]:
        """The Python files among ``files`` (its remote code, used with trust_remote_code)."""
        return tuple(name for name in self.files if name.endswith(".py"))


def cache_dir() -> Path:
    """huggingface_hub's cache folder, as the environment names it now."""
    env = os.environ
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Path(os.path.expandvars(hub)).expanduser().absolute()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser().absolute() / "hub"


def offline() -> bool:
    """Whether the environment asks for the cache alone (HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE)."""
    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any((value or "").strip().upper() in ("1", "ON", "YES", "TRUE") for value in values)


def timeout_s() -> float:
    try:
        return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or METADATA_TIMEOUT_S)
    except ValueError:
        return METADATA_TIMEOUT_S


def masked(value: Any) -> str:
    """A secret as shown in a message: its first three and last four characters at most."""
    text = str(value)
    return f"{text[:3]}…{text[-4:]} ({len(text)} characters)" if len(text) >= 16 else "*" * len(text)


def mask_tokens(text: str) -> str:
    """``text`` with every Hugging Face token in it masked."""
    return TOKEN.sub(lambda found: masked(found.group()), text)


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def repo_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a Hub repo id (huggingface_hub's own rule), or None."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        return str(error)
    return None


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` cannot name a branch, tag or commit (it also names a file under refs/)."""
    parts = revision.split("/")
    if not revision or len(revision) > 255 or any(not part or part in (".", "..") for part in parts):
        return "a revision is a branch, a tag or a commit sha (no empty, . or .. part)"
    if any(ch in revision for ch in "\\\x00") or not revision.isprintable() or revision != revision.strip():
        return "a revision holds no backslash, control character or surrounding space"
    return None


def kiln_files(names: Iterable[str], fmt: str, trust_remote_code: bool) -> tuple[str, ...]:
    """The files of a repo (relative paths) a Kiln input of format ``fmt`` uses: the top-level
    config and tokenizer files, and the weights: safetensors, else PyTorch ``pytorch_model*.bin``
    (onnx: the .onnx files and their external data); the .py files only with trust_remote_code.
    TensorFlow, Flax, GGUF, subfolders (onnx/, openvino/, ...) are left out."""
    top = sorted({name for name in names if "/" not in name})
    keep = [name for name in top if name.endswith(METADATA_SUFFIXES)]
    if fmt == "onnx":
        keep += [name for name in top if name.endswith(ONNX_SUFFIXES)]
    else:
        safetensors = [name for name in top if name.endswith(".safetensors")]
        keep += safetensors or [name for name in top if name.startswith("pytorch_model") and name.endswith(".bin")]
        if trust_remote_code:
            keep += [name for name in top if name.endswith(".py")]
    return tuple(sorted(set(keep)))


def lacking(files: Iterable[str], fmt: str, folder: Path | None = None) -> list[str]:
    """What a model of format ``fmt`` needs that ``files`` lacks; with ``folder`` (a snapshot),
    the files missing from it and the weight shards its index names that it does not hold."""
    names = set(files)
    needs = []
    if fmt == "onnx":
        needs += [] if "model.onnx" in names else ["model.onnx"]
    else:
        needs += [] if "config.json" in names else ["config.json"]
        if not any(name.endswith((".safetensors", ".bin")) for name in names):
            needs.append("weights (model.safetensors or pytorch_model.bin)")
    if folder is None:
        return needs
    needs += [name for name in sorted(names) if not (folder / name).is_file()]
    for index in sorted(name for name in names if name.endswith((".safetensors.index.json", ".bin.index.json"))):
        weights = index[: -len(".index.json")].rsplit(".", 1)[-1]  # safetensors | bin
        if not any(name.endswith(f".{weights}") for name in names):
            continue  # the index of weights not used (pytorch_model.bin.index.json beside safetensors)
        try:
            shards = set(json.loads((folder / index).read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            continue  # a broken index is reported by the folder's own checks
        needs += [shard for shard in sorted(shards) if isinstance(shard, str) and not (folder / shard).is_file()]
    return needs


def _snapshot_names(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in folder.iterdir() if entry.is_file()]  # a dangling link is absent
    except OSError:
        return []


def cached_commit(repo: Path, revision: str) -> str | None:
    """The commit the cache holds for ``revision`` (a commit sha, or a branch / tag under refs/)."""
    if COMMIT.fullmatch(revision):
        return revision if (repo / "snapshots" / revision).is_dir() else None
    try:
        commit = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None
    return commit if COMMIT.fullmatch(commit) and (repo / "snapshots" / commit).is_dir() else None


def cached_revisions(repo: Path) -> list[str]:
    """The revisions the cache holds for a repo: its branches and tags with their commits, then
    commits no branch names."""
    named: dict[str, str] = {}
    refs = repo / "refs"
    for ref in sorted(refs.rglob("*")) if refs.is_dir() else []:
        try:
            commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
        except (OSError, ValueError):
            continue
        if COMMIT.fullmatch(commit) and (repo / "snapshots" / commit).is_dir():
            named[ref.relative_to(refs).as_posix()] = commit
    snapshots = repo / "snapshots"
    commits = sorted(p.name for p in snapshots.iterdir() if COMMIT.fullmatch(p.name)) if snapshots.is_dir() else []
    return [f"{name} ({commit[:12]})" for name, commit in named.items()] + [c for c in commits if c not in named.values()]


def _ask_hub(repo_id: str, revision: str) -> tuple[str, list[str] | None]:
    """The commit ``revision`` names on the Hub and the files of that commit. Raises HubProblem
    for an answer that says the model or revision does not exist, ``_Unreachable`` otherwise."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        info = HfApi().model_info(repo_id, revision=revision, timeout=timeout_s())
    except GatedRepoError:
        raise HubProblem(
            "model",
            f"{repo_id} is gated on the Hugging Face Hub: its files are served to accounts that accepted its terms",
            given=repo_id,
            hint=f"accept its terms at https://huggingface.co/{repo_id}, then set HF_TOKEN in the environment to a token of that account",
        ) from None
    except RepositoryNotFoundError:
        raise HubProblem(
            "model",
            f"the Hugging Face Hub has no model {repo_id} (or it is private and no token given can read it)",
            given=repo_id,
            hint=f"check the id (https://huggingface.co/{repo_id}); for a private model set HF_TOKEN in the environment; for a local folder use `path:`",
        ) from None
    except RevisionNotFoundError:
        raise HubProblem(
            "revision",
            f"{repo_id} has no revision {revision} on the Hugging Face Hub",
            given=revision,
            expected="a branch, a tag or a full commit sha of the repo",
            hint=f"see its branches and tags at https://huggingface.co/{repo_id}/tree/main (the branch list), or leave revision out for main",
        ) from None
    except DisabledRepoError:
        raise HubProblem("model", f"{repo_id} is disabled on the Hugging Face Hub", given=repo_id, hint="use another model") from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:  # OSError: offline mode set at import, a socket error
        raise _Unreachable(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    siblings = info.siblings
    return str(info.sha), None if siblings is None else [s.rfilename for s in siblings]


class _Unreachable(Exception):
    """The Hub did not answer (no network, a timeout, an error on its side)."""


def locate(repo_id: str, revision: str | None, fmt: str, trust_remote_code: bool) -> HubModel:
    """The commit ``revision`` of ``repo_id`` names and where the cache holds it, without
    downloading anything. Raises HubProblem when it cannot be used."""
    revision = revision or DEFAULT_REVISION
    cache = cache_dir()
    repo = repo_folder(cache, repo_id)
    known = cached_commit(repo, revision)
    reason = "HF_HUB_OFFLINE is set" if offline() else None
    unreachable = None
    immutable = known is not None and known == revision  # a cached commit: the Hub cannot say otherwise
    if reason is None and not (immutable and not _snapshot_lacks(repo, known, fmt, trust_remote_code)):
        try:
            commit, names = _ask_hub(repo_id, revision)
        except _Unreachable as error:
            unreachable = reason = f"the Hub cannot be reached ({error})"
        else:
            return _online(repo_id, revision, commit, names, repo, fmt, trust_remote_code)
    if not repo.is_dir():
        revision_flag = "" if revision == DEFAULT_REVISION else f" --revision {revision}"
        raise HubProblem(
            "model",
            f"{repo_id} is not in the Hugging Face cache ({cache}) and {reason}",
            given=repo_id,
            hint=FIX_OFFLINE.format(repo=repo_id, revision=revision_flag),
        )
    if known is None:
        held = cached_revisions(repo)
        raise HubProblem(
            "revision",
            f"the Hugging Face cache ({cache}) holds no revision {revision} of {repo_id}, and {reason}",
            given=revision,
            expected="a revision the cache holds: " + (", ".join(held) if held else "none (its folder holds no snapshot)"),
            hint=f"use one of those, or download it where the Hub is reachable: `hf download {repo_id} --revision {revision}`",
        )
    folder = repo / "snapshots" / known
    files = kiln_files(_snapshot_names(folder), fmt, trust_remote_code)
    missing = lacking(files, fmt, folder)
    if missing:
        raise HubProblem(
            "model",
            f"the Hugging Face cache holds {repo_id} at {revision} (commit {known}) without {', '.join(missing)}, and {reason}",
            given=str(folder),
            hint=FIX_OFFLINE.format(repo=repo_id, revision="" if revision == DEFAULT_REVISION else f" --revision {revision}"),
        )
    note = f"{repo_id}: {unreachable}: using the cache's {revision} (commit {known[:12]})" if unreachable else None
    return HubModel(repo_id, revision, known, folder, files, present=True, note=note)


def _snapshot_lacks(repo: Path, commit: str, fmt: str, trust_remote_code: bool) -> bool:
    folder = repo / "snapshots" / commit
    return bool(lacking(kiln_files(_snapshot_names(folder), fmt, trust_remote_code), fmt, folder))


def _online(repo_id: str, revision: str, commit: str, names: list[str] | None, repo: Path, fmt: str, trust_remote_code: bool) -> HubModel:
    """The model as the Hub lists it at ``commit``; present when the cache holds every file Kiln uses."""
    folder = repo / "snapshots" / commit
    if names is None:  # the Hub did not list the files: what the snapshot holds decides
        names = _snapshot_names(folder)
    else:
        missing = lacking(kiln_files(names, fmt, trust_remote_code), fmt)
        if missing:
            shown = ", ".join(sorted(names)[:12]) + (", ..." if len(names) > 12 else "")
            raise HubProblem(
                "model",
                f"{repo_id} at {revision} (commit {commit}) has no {', '.join(missing)} at its top level: it is no {fmt} model Kiln can load",
                given=shown or "no files",
                hint="use a repo holding a transformers model (config.json and weights)"
                if fmt == "hf"
                else "use a repo holding model.onnx, or format: hf",
            )
    files = kiln_files(names, fmt, trust_remote_code)
    present = not lacking(files, fmt, folder)
    note = None
    if not present:
        note = (
            f"{repo_id} at {revision} (commit {commit[:12]}) is not in the Hugging Face cache ({repo.parent}) yet: "
            f"`engine run` downloads the {len(files)} files Kiln uses of it"
        )
    return HubModel(repo_id, revision, commit, folder, files, present=present, note=note)


def download(model: HubModel, fmt: str, trust_remote_code: bool) -> HubModel:
    """Fetch what Kiln uses of ``model``'s commit into the cache (what it holds already is not
    fetched again), and name the commit by its revision there (refs/<revision>), so a later run
    offline finds it as huggingface_hub would."""
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    patterns = [glob.escape(name) for name in model.files] or ["*.json", "*.txt", "*.safetensors", "*.model"]
    try:
        snapshot_download(model.repo_id, revision=model.commit, cache_dir=cache_dir(), allow_patterns=patterns, etag_timeout=timeout_s())
    except (GatedRepoError, RepositoryNotFoundError) as error:
        raise HubProblem(
            "model", f"{model.repo_id} cannot be downloaded: {error}", given=model.repo_id, hint="set HF_TOKEN in the environment"
        ) from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as error:
        raise HubProblem(
            "model",
            f"{model.repo_id} (commit {model.commit}) could not be downloaded: {str(error).splitlines()[0] if str(error) else type(error).__name__}",
            given=model.repo_id,
            hint=FIX_OFFLINE.format(repo=model.repo_id, revision=f" --revision {model.commit}"),
        ) from None
    repo = model.folder.parent.parent
    if model.revision != model.commit:
        ref = repo / "refs" / model.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        scratch = ref.with_name(f".{ref.name}.{os.getpid()}")
        scratch.write_text(model.commit, encoding="utf-8")
        os.replace(scratch, ref)
    files = kiln_files(_snapshot_names(model.folder), fmt, trust_remote_code)
    missing = lacking(files, fmt, model.folder)
    if missing:
        raise HubProblem(
            "model",
            f"{model.repo_id} (commit {model.commit}) was downloaded without {', '.join(missing)}",
            given=str(model.folder),
            hint="run again; if it persists, remove the folder and download it with `hf download`",
        )
    return replace(model, files=files, present=True, note=None)
