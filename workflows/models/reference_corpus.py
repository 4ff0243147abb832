"""The reference decoder's corpus: English prose and technical text available offline, extracted
from the Python standard library and the installed packages, with a manifest of what it took.

What it takes, per source file, in sorted order (package name, then path):

- ``.py`` files (parsed with ``ast``, never imported): the module, class and function docstrings;
- ``.rst`` / ``.md`` / ``.txt`` documentation shipped inside a package (licences, requirement
  lists and packaging metadata left out).

Each piece is split into paragraphs; a paragraph is kept when most of its lines read as English
(mostly letters, several words, few code symbols) and it was not seen before (deduplicated over
the whole corpus by the digest of its normalised text; the first in sorted order wins). One
source file is one document. The held-out split is chosen by whole document: a document is held
out when the digest of its ``package/path`` falls in the first ``heldout_per_mille`` of 1000, so
the split does not depend on what else is installed. Held-out documents are never trained on
(neither the tokenizer nor the model sees them).

The manifest (``manifest.jsonl``) has one line per kept document: package, version, path relative
to its root, split, characters and the sha256 of the extracted text; its own sha256 is the
corpus digest the reference decoder's recipe hash includes. Site-packages differ between
machines, so two machines may extract different corpora: the digest tells, and a different
corpus means a different model.

The corpus is written to ``$KILN_REFERENCE_CACHE`` (default ``~/.cache/kiln/reference-decoder``)
under ``corpus/<key>/``, where the key hashes this file's code, the spec and the installed
distributions' names and versions; a second call with the same key reads it back. Writes are
atomic (temporary folder, then rename).

    python workflows/models/reference_corpus.py        # build (or find) the full corpus, print its summary
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_ENV = "KILN_REFERENCE_CACHE"
DOC_SUFFIXES = (".rst", ".md", ".txt")
LONG_LITERAL = 200
WORKERS = 2
SKIP_NAMES = re.compile(r"(licen[cs]e|copying|notice|authors|requirements|record|top_level|entry_points|sources|dependency_links)", re.I)
SKIP_DIRS = {"__pycache__", "test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip"}
WORD = re.compile(r"[A-Za-z][a-z]+")
CODE = re.compile(r"(>>>|::|[{}\[\]=<>|\\#$@~^])")


@dataclass(frozen=True)
class CorpusSpec:
    """What to extract. ``include`` restricts to paths starting with one of the prefixes
    (``"stdlib:json/"``, ``"numpy:numpy/linalg/"``); ``max_chars`` stops after that many kept
    characters (in sorted order); the tiny CI recipe uses both."""

    stdlib: bool = True
    packages: bool = True
    include: tuple[str, ...] = ()
    max_chars: int | None = None
    heldout_per_mille: int = 10
    min_paragraph_chars: int = 40


@dataclass
class Corpus:
    folder: Path
    digest: str
    train: list[str] = field(default_factory=list)
    heldout: list[str] = field(default_factory=list)
    heldout_ids: list[str] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kiln" / "reference-decoder")


def _sources(spec: CorpusSpec) -> Iterator[tuple[str, str, str, Path]]:
    """(package, version, relative path, absolute path) of every candidate file, sorted."""
    found: list[tuple[str, str, str, Path]] = []
    if spec.stdlib:
        root = Path(sysconfig.get_paths()["stdlib"])
        version = ".".join(map(str, sys.version_info[:3]))
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if not SKIP_DIRS.intersection(rel.parts[:-1]):
                found.append(("python-stdlib", version, rel.as_posix(), path))
    if spec.packages:
        seen: set[str] = set()
        for dist in importlib.metadata.distributions():
            name = (dist.metadata["Name"] or "").lower().replace("_", "-")
            if not name or name in seen or not dist.files:
                continue
            seen.add(name)
            for entry in dist.files:
                rel = entry.as_posix() if hasattr(entry, "as_posix") else str(entry)
                parts = rel.split("/")
                if rel.startswith("..") or SKIP_DIRS.intersection(parts[:-1]):
                    continue
                if ".dist-info" in rel or ".egg-info" in rel:
                    if parts[-1] == "METADATA":  # the package's long description: its README
                        found.append((name, dist.version, rel, Path(str(entry.locate()))))
                    continue
                suffix = Path(rel).suffix
                if suffix == ".py" or (suffix in DOC_SUFFIXES and not SKIP_NAMES.search(parts[-1])):
                    found.append((name, dist.version, rel, Path(str(entry.locate()))))
    for item in sorted(found, key=lambda f: (f[0], f[2])):
        key = f"{item[0]}:{item[2]}"
        if not spec.include or key.startswith(spec.include):
            yield item


def _docstrings(text: str) -> list[str]:
    """Module, class and function docstrings, then other string literals of at least
    ``LONG_LITERAL`` characters (help texts, the standard library's ``pydoc_data`` topics), in
    source order; the English filter decides what of them is prose."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    docs = [doc for node in nodes if (doc := ast.get_docstring(node, clean=True))]
    seen = set(docs)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) >= LONG_LITERAL:
            cleaned = inspect.cleandoc(node.value)
            if cleaned not in seen:
                seen.add(cleaned)
                docs.append(cleaned)
    return docs


def _pieces(item: tuple[str, str, str, Path]) -> list[str]:
    """The raw text pieces of one source file (run in a worker process)."""
    _, _, rel, path = item
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if rel.endswith(".py"):
        return _docstrings(raw)
    if rel.endswith("METADATA"):  # headers, a blank line, then the description
        return [raw.partition("\n\n")[2]]
    return [raw]


def english(text: str) -> bool:
    """Prose, not code: ASCII, at least six words, mostly letters, few code symbols."""
    if not text.isascii() or len(WORD.findall(text)) < 6:
        return False
    letters = sum(c.isalpha() for c in text)
    visible = sum(not c.isspace() for c in text)
    return letters >= 0.65 * visible and len(CODE.findall(text)) * 20 <= len(text)


def paragraphs(pieces: list[str], min_chars: int) -> list[str]:
    """English paragraphs of ``pieces``: blank-line separated, lines re-joined with spaces; a
    paragraph with a doctest, shell or markup-directive line is dropped."""
    kept = []
    for piece in pieces:
        for block in re.split(r"\n\s*\n", piece):
            lines = [line.strip() for line in block.splitlines() if line.strip()]
            if any(line.startswith((">>>", "$ ", "..", "```", "|", "+-", "==", "--")) for line in lines):
                continue
            text = " ".join(lines)
            if len(text) >= min_chars and english(text):
                kept.append(text)
    return kept


def _is_heldout(package: str, path: str, per_mille: int) -> bool:
    return int(hashlib.sha256(f"{package}/{path}".encode()).hexdigest()[:8], 16) % 1000 < per_mille


def corpus_key(spec: CorpusSpec) -> str:
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()} if spec.packages else set())
    material = {
        "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "spec": asdict(spec),
        "python": sys.version,
        "distributions": dists,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _extract(spec: CorpusSpec, folder: Path) -> None:
    seen: set[str] = set()
    total = 0
    sources = list(_sources(spec))
    with (
        (folder / "train.jsonl").open("w") as train,
        (folder / "heldout.jsonl").open("w") as heldout,
        (folder / "manifest.jsonl").open("w") as manifest,
    ):
        with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
            for (package, version, rel, _), pieces in zip(sources, pool.imap(_pieces, sources, chunksize=32), strict=True):
                kept = []
                for paragraph in paragraphs(pieces, spec.min_paragraph_chars):
                    digest = hashlib.sha256(" ".join(paragraph.lower().split()).encode()).hexdigest()
                    if digest not in seen:
                        seen.add(digest)
                        kept.append(paragraph)
                if not kept:
                    continue
                text = "\n".join(kept)
                split = "heldout" if _is_heldout(package, rel, spec.heldout_per_mille) else "train"
                record = {"package": package, "version": version, "path": rel, "split": split, "chars": len(text)}
                record["sha256"] = hashlib.sha256(text.encode()).hexdigest()
                manifest.write(json.dumps(record, sort_keys=True) + "\n")
                (heldout if split == "heldout" else train).write(json.dumps({"id": f"{package}:{rel}", "text": text}) + "\n")
                total += len(text)
                if spec.max_chars is not None and total >= spec.max_chars:
                    break
    digest = hashlib.sha256((folder / "manifest.jsonl").read_bytes()).hexdigest()
    (folder / "manifest.sha256").write_text(digest + "\n")


def _read(folder: Path) -> Corpus:
    corpus = Corpus(folder=folder, digest=(folder / "manifest.sha256").read_text().strip())
    for line in (folder / "train.jsonl").read_text().splitlines():
        corpus.train.append(json.loads(line)["text"])
    for line in (folder / "heldout.jsonl").read_text().splitlines():
        record = json.loads(line)
        corpus.heldout.append(record["text"])
        corpus.heldout_ids.append(record["id"])
    records = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    corpus.summary = {
        "digest": corpus.digest,
        "documents": {"train": len(corpus.train), "heldout": len(corpus.heldout)},
        "chars": {"train": sum(map(len, corpus.train)), "heldout": sum(map(len, corpus.heldout))},
        "packages": len({r["package"] for r in records}),
    }
    return corpus


def build_corpus(spec: CorpusSpec = CorpusSpec(), root: Path | None = None) -> Corpus:
    """The corpus for ``spec``, extracted on the first call and read back after."""
    base = (root or cache_root()) / "corpus"
    folder = base / corpus_key(spec)[:32]
    if not (folder / "manifest.sha256").is_file():
        base.mkdir(parents=True, exist_ok=True)
        log.info("extracting the reference corpus into %s", folder)
        tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=base))
        try:
            _extract(spec, tmp)
            if (folder / "manifest.sha256").is_file():  # another build won the race: same key, same content
                shutil.rmtree(tmp)
            else:
                tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _read(folder)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(json.dumps(build_corpus().summary, indent=1))
