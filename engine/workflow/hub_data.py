"""Datasets on the Hugging Face Hub as workflow data (a data source with ``hub_dataset`` set: ``hf_dataset``).

A Hub dataset is read from huggingface_hub's cache alone (``<cache>/datasets--ORG--NAME``: ``refs/<branch
or tag>`` naming a commit, ``snapshots/<commit>/`` holding the files, as ``hf download ORG/NAME
--repo-type dataset`` lays them out). Kiln never downloads a dataset: the revision must be in the cache,
and the commit it names is what the run reads, records in workflow.lock.json and hashes into the
dataset's key. The cache folder is the one Hub models use (HF_HUB_CACHE, else HF_HOME/hub).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.workflow.hub import COMMIT, HubProblem, cache_dir, cached_commit, cached_revisions, repo_id_problem, revision_problem


def dataset_folder(cache: Path, repo_id: str) -> Path:
    return cache / f"datasets--{repo_id.replace('/', '--')}"


def fetch_command(repo_id: str, revision: str) -> str:
    return f"hf download {repo_id} --repo-type dataset" + ("" if revision == "main" else f" --revision {revision}")


def locate_dataset(repo_id: Any, revision: Any) -> tuple[str, Path]:
    """(commit, snapshot folder) of a Hub dataset's revision in the cache; HubProblem (key ``name`` or
    ``revision``) when it is not a repo id, or not there."""
    if not isinstance(repo_id, str) or repo_id_problem(repo_id):
        raise HubProblem("name", "is not a Hugging Face Hub dataset id", given=repr(repo_id), expected="ORG/NAME (e.g. nyu-mll/glue)")
    revision = "main" if revision is None else revision
    why = revision_problem(revision) if isinstance(revision, str) else "a revision is text"
    if why:
        raise HubProblem("revision", why, given=repr(revision))
    cache = cache_dir()
    repo = dataset_folder(cache, repo_id)
    commit = cached_commit(repo, revision)
    if commit is None:
        held = cached_revisions(repo)
        fetch = f"fetch it on a connected machine: `{fetch_command(repo_id, revision)}`, then copy the cache here or point HF_HUB_CACHE / HF_HOME at one holding it"
        if not held:
            raise HubProblem(
                "name",
                f"the Hub dataset {repo_id} is not in the Hugging Face datasets cache ({cache})",
                given=str(repo),
                expected=f"the folder {repo.name} in the cache",
                hint=fetch,
            )
        raise HubProblem(
            "revision",
            f"revision {revision} of the Hub dataset {repo_id} is not in the Hugging Face datasets cache ({cache})",
            given=revision,
            expected="one the cache holds: " + ", ".join(held[:8]),
            hint=fetch,
        )
    assert COMMIT.fullmatch(commit)
    return commit, repo / "snapshots" / commit
