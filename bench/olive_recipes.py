"""How faithfully do Olive's published recipes come over? Every config of a corpus, imported and validated.

    python bench/olive_recipes.py CORPUS_DIR [--json PATH] [--show N] [--long-names]

The corpus is a folder of Olive configs (microsoft/olive-recipes): every ``.json`` file under it
holding both ``input_model`` and ``passes``. Each is translated as ``engine import-olive`` does
(the same reading and shape checks), the workflow is written into a temporary folder (its paths
written relative to it, so they still reach the recipe's files) and validated in-process with
Kiln's loader, with ``HF_HUB_OFFLINE=1`` and an empty Hub cache: a model named by its Hub id is
then not in the cache, nor a Hub dataset an ``hf_dataset`` names, and a problem about only that
(``engine.olive.cli.awaits_cache``) counts as "valid apart from missing Hub models and datasets".

It prints, per Olive pass type, how many of its uses were carried over to a Kiln step, and the
totals: configs, imported (translated without an error), every pass carried, valid, valid apart
from missing Hub models and datasets, device changes, synthetic stand-ins left, and whether the
importer's own validation (``Translation.problems``) agrees with the validator run on the written
file. A device change is an accelerator (device and execution provider) of the system Olive's
engine runs on (its default is the CPU), or one beyond the CPU of any other system of the config,
that no translated target runs on; it is silent unless a key not carried over names its execution
provider. ``--long-names`` imports a copy of each config named after its full path in the corpus.
``--json`` also writes every figure and each config's outcome to a file.

Goals: at least 97% imported, 90% valid apart from missing Hub models and datasets, no silent device change,
no synthetic stand-in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MISSING_MODEL_KEYS = ("input.model", "input.revision")
GOALS = {"imported": 0.97, "valid_apart_from_missing_models": 0.90}
#: Olive's device names and the devices of Kiln's targets that run them
DEVICES = {"cpu": {"cpu"}, "gpu": {"gpu", "cuda", "dml", "webgpu"}, "npu": {"npu"}}


def corpus_configs(corpus: Path) -> list[Path]:
    found = []
    for path in sorted(corpus.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and "input_model" in data and "passes" in data:
            found.append(path)
    return found


def olive_passes(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, type) of each pass of the config; a list of configs of one pass counts once."""
    found = []
    for name, value in (config.get("passes") or {}).items():
        first = value[0] if isinstance(value, list) and value else value
        found.append((str(name), str(first.get("type", "")) if isinstance(first, dict) else ""))
    return found


def system_pairs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The (device, execution provider) pairs a recipe names: those of the system Olive's engine runs on
    (the first system when the engine names none; Olive's local CPU when there are none), and every
    accelerator beyond the CPU of its other systems. A device left out is the one Olive infers from the
    execution provider."""
    from engine.olive.systems import accelerator_pairs

    engine = {**(config.get("engine") or {}), **{k: v for k, v in config.items() if k == "target"}}
    systems = config.get("systems") or {}
    chosen = engine.get("target")
    name = chosen if isinstance(chosen, str) else ("" if isinstance(chosen, dict) else next(iter(systems), ""))
    pairs = accelerator_pairs(chosen if isinstance(chosen, dict) else systems.get(name))
    for other, system in systems.items():
        if other != name:
            pairs += [p for p in accelerator_pairs(system) if p != ("cpu", "CPUExecutionProvider") and p not in pairs]
    return pairs


def runs_on(target: dict[str, Any], device: str, ep: str) -> bool:
    """Whether a translated target runs Olive's (device, execution provider)."""
    from engine.olive.systems import GENAI_DEVICE

    kiln_device = str(target.get("device", "cpu")).lower()
    runtime = target.get("runtime")
    if runtime == "onnxruntime":
        providers = [p.lower() for p in target.get("providers") or ["CPUExecutionProvider"]]
        return kiln_device in DEVICES.get(device, {device}) and providers[0] == ep.lower()
    if runtime == "openvino":  # OpenVINO's own runtime stands for its execution provider, on the same device
        return ep in ("OpenVINOExecutionProvider", "CPUExecutionProvider") and kiln_device == device
    if runtime == "onnxruntime-genai":
        return GENAI_DEVICE.get(ep) == kiln_device
    return False


def device_changes(config: dict[str, Any], targets: list[dict[str, Any]], unmapped: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The accelerators no target runs on: (reported ones, silent ones). One is reported when a key not
    carried over names its execution provider, in the key or in the reason."""
    reported: list[str] = []
    silent: list[str] = []
    for device, ep in system_pairs(config):
        if any(runs_on(t, device, ep) for t in targets):
            continue
        text = f"{device}/{ep}"
        told = any(ep in where or ep in why for where, why in unmapped)
        (reported if told else silent).append(text)
    return reported, silent


def validate(path: Path) -> list[Any]:
    from engine.core.errors import InputError
    from engine.workflow import load_workflow

    try:
        load_workflow(path)
    except InputError as error:
        return list(error.problems)
    return []


def missing_model(problem: Any) -> bool:
    """A problem that only says a Hub model or dataset is not in the (empty, offline) cache."""
    from engine.olive.cli import awaits_cache

    return bool(awaits_cache(problem))


def one(path: Path, corpus: Path, scratch: Path) -> dict[str, Any]:
    from engine.core.errors import InputError
    from engine.olive.cli import load_translation, to_yaml

    relative = path.relative_to(corpus)
    row: dict[str, Any] = {"config": relative.as_posix()}
    config = json.loads(path.read_text(encoding="utf-8"))
    row["passes"] = olive_passes(config)
    dest = scratch / relative.parent
    dest.mkdir(parents=True, exist_ok=True)
    try:
        translation = load_translation(path, dest)
    except InputError as error:
        first = error.problems[0] if error.problems else None
        row.update(imported=False, error=f"{first.where}: {first.message}: {first.given}"[:300] if first else str(error)[:300])
        return row
    unmapped_keys = {where for where, _ in translation.unmapped}
    row["imported"] = True
    row["carried"] = [f"passes.{name}" not in unmapped_keys for name, _ in row["passes"]]
    row["unmapped"] = translation.unmapped
    workflow = dest / f"{path.stem}.kiln.yaml"
    workflow.write_text(to_yaml(translation, path), encoding="utf-8")
    problems = validate(workflow)
    row["problems"] = [{"where": p.where, "message": p.message, "given": p.given} for p in problems]
    row["valid"] = not problems
    row["valid_apart_from_missing_models"] = all(missing_model(p) for p in problems)
    row["missing_model"] = bool(problems) and row["valid_apart_from_missing_models"]
    # the importer validates what it writes: it must agree with the validator run on the written file
    row["importer_agrees"] = sorted((p.where, p.message) for p in translation.problems) == sorted((p.where, p.message) for p in problems)
    row["stand_ins"] = sum("synthetic stand-in" in note for note in translation.notes)
    reported, silent = device_changes(config, translation.workflow.get("targets") or [], translation.unmapped)
    row["device_changes_reported"], row["device_changes_silent"] = reported, silent
    return row


def long_named(corpus: Path, configs: list[Path], scratch: Path) -> tuple[Path, list[Path]]:
    """The corpus copied to ``scratch``, each config beside a copy of itself named after its full path
    (``a/b/config.json`` → ``a/b/a-b-config.json``): the long file names users give their configs."""
    shutil.copytree(corpus, scratch, symlinks=True)
    named = []
    for path in configs:
        relative = path.relative_to(corpus)
        copy = scratch / relative.parent / relative.as_posix().replace("/", "-")
        shutil.copyfile(path, copy)
        named.append(copy)
    return scratch, named


def percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.1f}%)" if whole else "0/0"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    uses: Counter[str] = Counter()
    carried: Counter[str] = Counter()
    for row in rows:
        for (_, kind), done in zip(row["passes"], row.get("carried") or [False] * len(row["passes"]), strict=True):
            uses[kind] += 1
            carried[kind] += done
    imported = [r for r in rows if r["imported"]]
    return {
        "configs": len(rows),
        "imported": len(imported),
        "every_pass_carried": sum(1 for r in imported if all(r["carried"])),
        "valid": sum(1 for r in imported if r["valid"]),
        "valid_apart_from_missing_models": sum(1 for r in imported if r["valid_apart_from_missing_models"]),
        "only_missing_models": sum(1 for r in imported if r["missing_model"]),
        "device_changes_reported": sum(len(r["device_changes_reported"]) for r in imported),
        "device_changes_silent": sum(len(r["device_changes_silent"]) for r in imported),
        "stand_ins": sum(r["stand_ins"] for r in imported),
        "configs_with_stand_ins": sum(1 for r in imported if r["stand_ins"]),
        "importer_disagrees": sum(1 for r in imported if not r["importer_agrees"]),
        "passes": {kind: {"carried": carried[kind], "uses": uses[kind]} for kind, _ in uses.most_common()},
    }


def report(summary: dict[str, Any], rows: list[dict[str, Any]], show: int) -> None:
    width = max((len(k) for k in summary["passes"]), default=10)
    print(f"{'Olive pass':<{width}}  carried / uses")
    for kind, counts in summary["passes"].items():
        print(f"{kind:<{width}}  {counts['carried']:>7} / {counts['uses']}")
    total = summary["configs"]
    print()
    print(f"configs                          {total}")
    print(f"imported                         {percent(summary['imported'], total)}  (goal >= {GOALS['imported']:.0%})")
    print(f"every pass carried               {percent(summary['every_pass_carried'], total)}")
    print(f"valid                            {percent(summary['valid'], total)}")
    print(
        f"valid apart from missing Hub data  {percent(summary['valid_apart_from_missing_models'], total)}"
        f"  (goal >= {GOALS['valid_apart_from_missing_models']:.0%}; {summary['only_missing_models']} need only a Hub model or dataset)"
    )
    print(
        f"device changes                   {summary['device_changes_reported']} reported, {summary['device_changes_silent']} silent (goal: 0 silent)"
    )
    print(f"synthetic stand-ins              {summary['stand_ins']} in {summary['configs_with_stand_ins']} configs (goal: 0)")
    print(f"importer's own validation        disagrees with the validator on {summary['importer_disagrees']} (goal: 0)")
    failures = Counter(r["error"] for r in rows if not r["imported"])
    problems = Counter(
        f"{p['where']}: {p['message']}"[:160]
        for r in rows
        if r["imported"]
        for p in r["problems"]
        if not r["valid_apart_from_missing_models"]
    )
    silent = Counter(change for r in rows if r["imported"] for change in r["device_changes_silent"])
    for title, counter in (("not imported", failures), ("validation problems", problems), ("silent device changes", silent)):
        if counter and show:
            print(f"\n{title} (most frequent {show}):")
            for text, count in counter.most_common(show):
                print(f"  {count:>4}  {text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="folder of Olive configs (searched recursively)")
    parser.add_argument("--json", type=Path, help="also write the figures and each config's outcome here")
    parser.add_argument(
        "--long-names",
        action="store_true",
        help="import a copy of each config named after its full path in the corpus (beside it, so its files still resolve)",
    )
    parser.add_argument("--show", type=int, default=10, help="most frequent failures and problems listed (0: none)")
    args = parser.parse_args()
    corpus = args.corpus.resolve()
    configs = corpus_configs(corpus)
    if not configs:
        raise SystemExit(f"no Olive config (a .json with input_model and passes) under {corpus}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-olive-recipes-") as scratch:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_HUB_CACHE"] = str(Path(scratch) / "hub-cache")  # empty: Hub models are not in it
        (Path(scratch) / "hub-cache").mkdir()
        if args.long_names:
            corpus, configs = long_named(corpus, configs, Path(scratch) / "corpus")
        rows = [one(path, corpus, Path(scratch) / "workflows") for path in configs]
    summary = summarize(rows)
    report(summary, rows, args.show)
    print(f"\n({time.perf_counter() - started:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps({"corpus": str(corpus), "summary": summary, "configs": rows}, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
