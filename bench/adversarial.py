"""A short adversarial campaign against the CLI, as real `python -m engine ...` subprocesses on
tiny real ONNX models in temp folders, each with a timeout. It reports counts; it judges nothing.

    python bench/adversarial.py [--cases N] [--kills N] [--concurrent N] [--seed S] [--json PATH]

1. fuzz: N workflows, every other one a hostile kind in turn (symlink loops, folders, FIFOs and
   /dev/zero as paths, a 10**12-point range, a range on a bool, 1000 duplicate values, inverted
   bounds, `version: true`, BOM-prefixed JSON, 300-char ids, a YAML python tag, an alias bomb,
   20000-deep nesting, invalid UTF-8, duplicate keys, a token in the file), the others seeded
   structural / textual mutations of a valid workflow; each through `engine validate` and
   `engine plan`. Counted: exit 3 (bug), other exits than 0/2 (unexpected), tracebacks, hangs,
   validate/plan disagreements, side effects (validate writing anything, plan creating its
   store, the python tag run), the token echoed on the console.
2. kill-resume: the tiny workflow (FP32 + two dynamic INT8 variants; size, fidelity, latency;
   chosen by size) SIGKILLed at a random moment (the engine alone or its whole process group,
   alternately), then run again to completion: resumes that exit 0, choose the same bytes as an
   uninterrupted reference run, leave (once complete) no lock naming a dead process, and pass
   `engine verify`.
3. damage: a complete store damaged (object truncated, byte flipped, file deleted, record and
   manifest corrupted or deleted), then `engine verify`, `engine verify --repair`, `engine
   verify` again and a re-run; and the same damage re-run directly, without verify.
4. concurrency: N runs at once on one empty store, rounds alternating the grid and TPE: all exit
   0 and choose the bytes an uninterrupted run of the same workflow chose.
5. bad models: unknown-domain op, missing external data, truncated protobuf, empty file, graph
   cycle, dangling input as the workflow's input: `engine validate` and `engine run` must answer
   2 (or 1 with a reason), never 0 and never 3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _adversarial_cases import SECRET, bad_models, make_case, make_tiny_encoder, tiny_workflow, write_workflow

ROOT = Path(__file__).resolve().parents[1]
TRACEBACK = "Traceback (most recent call last)"
MEMORY_LIMIT = 6 << 30
COLUMNS = [
    ("cases", "cases"),
    ("ok", "ok"),
    ("not_ok", "not ok"),
    ("bug", "bug (3)"),
    ("unexpected", "other exit"),
    ("traceback", "traceback"),
    ("hang", "hang"),
    ("disagree", "disagree"),
    ("side_effect", "side effect"),
    ("leak", "token echoed"),
    ("completed", "completed"),
    ("same_choice", "same choice"),
    ("orphans", "orphans"),
    ("stale_locks", "stale locks"),
    ("verify_ok", "verify ok"),
    ("detected", "detected"),
    ("repaired", "repaired"),
    ("wall_s", "wall s"),
]


@dataclass
class Part:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, key: str, amount: int = 1) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + amount

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)

    def case(self, ok: bool, why: str, flags: set[str]) -> None:
        """One case: counted once in each column it has a flag for, whatever the number of commands."""
        self.add("cases")
        self.add("ok" if ok else "not_ok")
        for flag in flags:
            self.add(flag)
        if not ok:
            self.note(why)


@dataclass
class Result:
    code: int | None  # None: timed out (killed)
    output: str
    seconds: float

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.output


def _limits() -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_STORE",)}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    return env


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def engine(args: list[str], cwd: Path, timeout: float) -> Result:
    """``python -m engine ARGS`` in its own process group, memory-capped; killed (group) past ``timeout``."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", *args],
        cwd=cwd,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_limits,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        code = None
    _kill_group(proc)  # workers it may have left behind
    return Result(code, out.decode("utf-8", "replace"), time.monotonic() - started)


REASONS = ("traceback", "error", "failed", "problem", "no candidate", "refused", "could not", "damaged", "not ")


def _short(result: Result) -> str:
    """The line that says why (else the last line), for the notes."""
    if result.code is None:
        return f"timed out after {result.seconds:.0f} s"
    lines = [line.strip() for line in result.output.strip().splitlines() if line.strip() and line.strip()[0] not in "│┃┏┡└━┌├"]
    for at, line in enumerate(lines):
        if line.endswith(":") and "problem" in line and at + 1 < len(lines):
            return lines[at + 1][:160]
    why = [line for line in lines if any(word in line.lower() for word in REASONS)]
    return (why or lines or ["(no output)"])[0][:160]


def _group_left(pgid: int) -> int:
    """Processes still alive in the process group ``pgid``."""
    left = 0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                left += 1
        except (ProcessLookupError, psutil.Error):
            pass
    return left


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_symlink()} if folder.exists() else set()


# --- 1. fuzz --------------------------------------------------------------------------------


def fuzz(part: Part, tmp: Path, model: Path, cases: int, seed: int, timeout: float) -> None:
    base = tiny_workflow(model)
    codes: dict[tuple[str, int | None], int] = {}

    def one(index: int) -> None:
        folder = tmp / f"case{index}"
        kind, path = make_case(index, seed, base, folder)
        before = _listing(folder)
        validated = engine(["validate", path.name], folder, timeout)
        after_validate = _listing(folder)
        store = folder / "plan-store"
        planned = engine(["plan", path.name, "--store", str(store)], folder, timeout)
        problems: list[str] = []
        flags: set[str] = set()
        for verb, result in (("validate", validated), ("plan", planned)):
            if result.code is None:
                flags.add("hang")
                problems.append(f"{verb} hung")
            elif result.code == 3:
                flags.add("bug")
                problems.append(f"{verb} exit 3: {_short(result)}")
            elif result.code not in (0, 2):
                flags.add("unexpected")
                problems.append(f"{verb} exit {result.code}: {_short(result)}")
            if result.traceback:
                flags.add("traceback")
                problems.append(f"{verb} printed a traceback")
            if SECRET in result.output:
                flags.add("leak")
                problems.append(f"{verb} echoed the token")
        if {validated.code, planned.code} == {0, 2}:
            flags.add("disagree")
            problems.append(f"validate {validated.code}, plan {planned.code}: {_short(planned if planned.code else validated)}")
        effects = []
        if after_validate != before:
            effects.append("validate wrote " + ", ".join(sorted(after_validate - before))[:80])
        if store.exists():
            effects.append(f"plan (exit {planned.code}) created its store")
        if (folder / "EXECUTED").exists():
            effects.append("the python tag ran")
        if effects:
            flags.add("side_effect")
            problems.extend(effects)
        part.case(not problems, f"case {index} ({kind}): " + "; ".join(problems), flags)
        with part.lock:
            codes[("validate", validated.code)] = codes.get(("validate", validated.code), 0) + 1
            codes[("plan", planned.code)] = codes.get(("plan", planned.code), 0) + 1
        shutil.rmtree(folder, ignore_errors=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, range(cases)))
    for verb in ("validate", "plan"):
        seen = sorted(((code, n) for (v, code), n in codes.items() if v == verb), key=lambda item: (item[0] is None, item[0] or 0))
        part.note(f"(all cases) {verb} exits: " + ", ".join(f"{'timeout' if code is None else code}: {n}" for code, n in seen))


# --- runs and stores ------------------------------------------------------------------------


def chosen_digest(out: Path) -> str | None:
    """The chosen model's digest in candidates.json, with a hash of the bytes in the out folder."""
    try:
        records = json.loads((out / "candidates.json").read_text())["candidates"]
    except (OSError, ValueError, KeyError):
        return None
    chosen = [c for c in records if c.get("chosen")]
    if len(chosen) != 1:
        return None
    files = sorted(p for p in (out / chosen[0]["target"] / "model").rglob("*") if p.is_file())
    content = hashlib.sha256()
    for path in files:
        content.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{chosen[0].get('model_digest')}:{content.hexdigest()}"


def run(workflow: Path, store: Path, out: Path, timeout: float) -> tuple[Result, str | None]:
    result = engine(["run", str(workflow), "--store", str(store), "-o", str(out), "-q"], workflow.parent, timeout)
    return result, chosen_digest(out) if result.code == 0 else None


def stale_locks(store: Path) -> list[str]:
    """The job locks of ``store`` naming a process that is gone (or no readable owner)."""
    stale = []
    for path in sorted((store / "locks").glob("*.lock")):
        if len(path.stem) != 64:  # a job's lock is named by its key; others (search.lock) are flock files
            continue
        try:
            pid = int(json.loads(path.read_text())["owner"]["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            stale.append(f"{path.name[:12]} (no readable owner)")
            continue
        if not psutil.pid_exists(pid):
            stale.append(f"{path.name[:12]} (pid {pid})")
    return stale


def _check(flags: set[str], result: Result, what: str, problems: list[str]) -> None:
    if result.code is None:
        flags.add("hang")
        problems.append(f"{what} hung")
    elif result.code == 3:
        flags.add("bug")
        problems.append(f"{what} exit 3: {_short(result)}")
    elif result.code not in (0, 1, 2):
        flags.add("unexpected")
        problems.append(f"{what} exit {result.code}: {_short(result)}")
    if result.traceback:
        flags.add("traceback")
        problems.append(f"{what} printed a traceback")


# --- 2. kill-resume -------------------------------------------------------------------------


def kill_resume(
    part: Part, tmp: Path, workflow: Path, reference: str, reference_s: float, kills: int, rng: random.Random, timeout: float
) -> None:
    for index in range(kills):
        folder = tmp / f"kill{index}"
        store, out = folder / "store", folder / "out"
        folder.mkdir(parents=True)
        whole_group = index % 2 == 1
        # late enough for the first job to start, early enough to catch the run
        at = rng.uniform(0.8, max(reference_s * 1.1, 1.5))
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "run", str(workflow), "--store", str(store), "-o", str(out), "-q"],
            cwd=folder,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limits,
        )
        try:
            proc.wait(timeout=at)
            finished_first = True
        except subprocess.TimeoutExpired:
            finished_first = False
            if whole_group:
                _kill_group(proc)
            else:
                proc.kill()
            proc.wait()
        orphans = 0
        if not finished_first and not whole_group:
            deadline = time.monotonic() + 5.0
            while (orphans := _group_left(proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.25)
        _kill_group(proc)  # what a kill of the engine alone left behind
        resumed, digest = run(workflow, store, out, timeout)
        problems: list[str] = []
        flags: set[str] = set()
        _check(flags, resumed, "resume", problems)
        if resumed.code == 0:
            flags.add("completed")
        else:
            problems.append(f"resume exit {resumed.code}: {_short(resumed)}")
            # does the store resume, whatever the output folder holds?
            fresh, fresh_digest = run(workflow, store, folder / "fresh-out", timeout)
            same = "the same choice" if fresh_digest == reference else "another choice"
            problems.append(f"into a fresh --output: exit {fresh.code}" + (f", {same}" if fresh.code == 0 else f": {_short(fresh)}"))
        if digest == reference:
            flags.add("same_choice")
        elif resumed.code == 0:
            problems.append("a different choice than the reference run")
        if orphans:
            flags.add("orphans")
            problems.append(f"{orphans} worker process(es) still alive 5 s after the engine was killed")
        # a resume that stopped before the store was opened leaves the killed run's locks as they were
        locks = stale_locks(store) if resumed.code == 0 else []
        if locks:
            flags.add("stale_locks")
            problems.append(f"{len(locks)} lock(s) naming a dead process after the resume: {', '.join(locks)}")
        verified = engine(["verify", "--store", str(store)], folder, timeout)
        _check(flags, verified, "verify", problems)
        if verified.code == 0:
            flags.add("verify_ok")
        else:
            problems.append(f"verify exit {verified.code}: {_short(verified)}")
        how = "finished before the kill" if finished_first else f"{'group' if whole_group else 'engine'} killed at {at:.1f} s"
        part.case(not problems, f"kill {index} ({how}): " + "; ".join(problems), flags)
        shutil.rmtree(folder, ignore_errors=True)


# --- 3. damage ------------------------------------------------------------------------------


def _object_file(store: Path) -> Path:
    return sorted(p for p in (store / "objects").rglob("*") if p.is_file())[0]


def _truncate(store: Path) -> str:
    path = _object_file(store)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "object truncated"


def _flip(store: Path) -> str:
    path = _object_file(store)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    # keep size and mtime: only the hash can tell
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return "object byte flipped (same size and mtime)"


def _delete(store: Path) -> str:
    _object_file(store).unlink()
    return "object file deleted"


def _bad_record(store: Path) -> str:
    path = sorted((store / "keys").glob("*.json"))[0]
    path.write_text(path.read_text()[:40] + "{{{ not json")
    return "key record corrupted"


def _bad_manifest(store: Path) -> str:
    path = sorted((store / "manifests").glob("*.json"))[0]
    path.write_text('{"files": "nope"')
    return "manifest corrupted"


def _no_manifest(store: Path) -> str:
    sorted((store / "manifests").glob("*.json"))[0].unlink()
    return "manifest deleted"


DAMAGE = [_truncate, _flip, _delete, _bad_record, _bad_manifest, _no_manifest]


def damage(part: Part, tmp: Path, workflow: Path, store0: Path, reference: str, cases: int, timeout: float) -> None:
    plan = [(index, hurt, flow) for index, hurt in enumerate(DAMAGE) for flow in ("verify, repair, re-run", "re-run directly")]
    for index, hurt, flow in plan[:cases]:
        folder = tmp / f"damage{index}-{flow[:2]}"
        store, out = folder / "store", folder / "out"
        shutil.copytree(store0, store, symlinks=True)
        what = hurt(store)
        problems: list[str] = []
        flags: set[str] = set()
        if flow.startswith("verify"):
            found = engine(["verify", "--store", str(store)], folder, timeout)
            _check(flags, found, "verify", problems)
            if found.code == 1:
                flags.add("detected")
            else:
                problems.append(f"verify exit {found.code} (not detected): {_short(found)}")
            repair = engine(["verify", "--repair", "--store", str(store)], folder, timeout)
            _check(flags, repair, "verify --repair", problems)
            again = engine(["verify", "--store", str(store)], folder, timeout)
            _check(flags, again, "verify after repair", problems)
            if again.code == 0:
                flags.add("repaired")
            else:
                problems.append(f"verify after repair exit {again.code}: {_short(again)}")
        rerun, digest = run(workflow, store, out, timeout)
        _check(flags, rerun, "re-run", problems)
        if rerun.code == 0:
            flags.add("completed")
        else:
            problems.append(f"re-run exit {rerun.code}: {_short(rerun)}")
        if digest == reference:
            flags.add("same_choice")
        elif rerun.code == 0:
            problems.append("a different choice than the reference run")
        part.case(not problems, f"{what}, {flow}: " + "; ".join(problems), flags)
        shutil.rmtree(folder, ignore_errors=True)


# --- 4. concurrency -------------------------------------------------------------------------


def concurrency(part: Part, tmp: Path, model: Path, count: int, rounds: int, timeout: float) -> None:
    """Rounds alternate the grid and a TPE search (whose study the runs share) over a 4-point space
    it exhausts, so every run of a round has the same candidates to choose from."""
    space = {"per_channel": [False, True], "reduce_range": [False, True]}
    flows = {}
    for sampler in ("grid", "tpe"):
        workflow = tiny_workflow(model, search={"sampler": sampler, "max_candidates": 8, "seed": 1})
        workflow["steps"][0]["search"] = space
        path = write_workflow(tmp / sampler, workflow)
        result, reference = run(path, tmp / sampler / "store", tmp / sampler / "out", timeout)
        flows[sampler] = (path, reference)
        if reference is None:
            part.note(f"{sampler}: the uninterrupted reference run failed (exit {result.code}): {_short(result)}")
    for round_ in range(rounds):
        sampler = ("grid", "tpe")[round_ % 2]
        workflow, reference = flows[sampler]
        store = tmp / f"shared{round_}"
        with ThreadPoolExecutor(max_workers=count) as pool:
            outs = [tmp / f"out{round_}-{i}" for i in range(count)]
            results = list(pool.map(lambda out, store=store, workflow=workflow: run(workflow, store, out, timeout), outs))
        for i, (result, digest) in enumerate(results):
            problems: list[str] = []
            flags: set[str] = set()
            _check(flags, result, "run", problems)
            if result.code == 0:
                flags.add("completed")
            else:
                problems.append(f"exit {result.code}: {_short(result)}")
            if digest == reference:
                flags.add("same_choice")
            elif result.code == 0:
                problems.append("a different choice than the reference run")
            part.case(not problems, f"round {round_} ({sampler}) run {i}: " + "; ".join(problems), flags)
        locks = stale_locks(store)
        if locks:
            part.add("stale_locks")
            part.note(f"round {round_}: {len(locks)} lock(s) naming a dead process: {', '.join(locks)}")
        verified = engine(["verify", "--store", str(store)], tmp, timeout)
        if verified.code == 0:
            part.add("verify_ok")
        else:
            part.note(f"round {round_}: verify exit {verified.code}: {_short(verified)}")
        shutil.rmtree(store, ignore_errors=True)


# --- 5. bad models --------------------------------------------------------------------------


def bad_model_runs(part: Part, tmp: Path, cases: int, timeout: float) -> None:
    for index, (name, model) in enumerate(list(bad_models(tmp / "bad").items())[:cases]):
        folder = tmp / f"bad{index}"
        workflow = write_workflow(folder, tiny_workflow(model))
        problems: list[str] = []
        flags: set[str] = set()
        validated = engine(["validate", str(workflow)], folder, timeout)
        _check(flags, validated, "validate", problems)
        ran = engine(["run", str(workflow), "--store", str(folder / "store"), "-o", str(folder / "out"), "-q"], folder, timeout)
        _check(flags, ran, "run", problems)
        if ran.code == 0:
            problems.append("run exit 0 on an unloadable model")
        elif ran.code == 1 and not ("failed" in ran.output and "no candidate" in ran.output):
            problems.append(f"run exit 1 without a reason: {_short(ran)}")
        if validated.code == 0 and ran.code == 2:
            flags.add("disagree")
            problems.append(f"validate 0 but run 2: {_short(ran)}")
        part.case(
            not problems, f"{name}: validate {validated.code}, run {ran.code}" + ("; " + "; ".join(problems) if problems else ""), flags
        )
        if not problems:
            part.note(f"{name}: validate {validated.code}, run {ran.code}: {_short(ran)}")
        shutil.rmtree(folder, ignore_errors=True)


# --- the table ------------------------------------------------------------------------------

APPLIES = {
    "fuzz": {"bug", "unexpected", "traceback", "hang", "disagree", "side_effect", "leak"},
    "kill-resume": {"bug", "unexpected", "traceback", "hang", "orphans", "completed", "same_choice", "stale_locks", "verify_ok"},
    "damage": {"bug", "unexpected", "traceback", "hang", "completed", "same_choice", "detected", "repaired"},
    "concurrency": {"bug", "unexpected", "traceback", "hang", "completed", "same_choice", "stale_locks", "verify_ok"},
    "bad models": {"bug", "unexpected", "traceback", "hang", "disagree"},
}


def rows(parts: list[Part]) -> list[dict[str, Any]]:
    table = []
    for part in parts:
        row: dict[str, Any] = {"part": part.name}
        for key, _ in COLUMNS:
            if key == "wall_s":
                row[key] = round(part.wall_s, 1)
            elif key in ("cases", "ok", "not_ok") or key in APPLIES[part.name]:
                row[key] = part.counts.get(key, 0)
            else:
                row[key] = None
        table.append(row)
    return table


def render(table: list[dict[str, Any]]) -> str:
    header = ["part"] + [title for _, title in COLUMNS]
    body = [[row["part"]] + ["-" if row[key] is None else str(row[key]) for key, _ in COLUMNS] for row in table]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="fuzzed workflows (default 200)")
    parser.add_argument("--kills", type=int, default=10, help="killed and resumed runs (default 10)")
    parser.add_argument(
        "--damage",
        type=int,
        default=2 * len(DAMAGE),
        help=f"damaged stores (default {2 * len(DAMAGE)}: each kind, with and without verify)",
    )
    parser.add_argument("--bad-models", type=int, default=6, help="unloadable models (default 6: each kind)")
    parser.add_argument("--concurrent", type=int, default=3, help="runs at once on one store (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of concurrent runs (default 2)")
    parser.add_argument("--parts", default="fuzz,kill-resume,damage,concurrency,bad models", help="comma-separated parts to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds for validate / plan / verify (runs get 12x)")
    parser.add_argument("--notes", type=int, default=40, help="at most this many notes per part")
    parser.add_argument("--json", type=Path, help="write the table and the notes here")
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.parts.split(",") if name.strip()]
    started = time.monotonic()
    rng = random.Random(args.seed)
    parts: list[Part] = []
    run_timeout = args.timeout * 12
    with tempfile.TemporaryDirectory(prefix="kiln-adversarial-") as name:
        tmp = Path(name)
        model = make_tiny_encoder(tmp / "model" / "model.onnx")
        workflow = write_workflow(tmp / "wf", tiny_workflow(model))

        def timed(part_name: str, body: Any) -> None:
            if part_name not in wanted:
                return
            part = Part(part_name)
            began = time.monotonic()
            body(part)
            part.wall_s = time.monotonic() - began
            parts.append(part)
            print(
                f"{part_name}: {part.counts.get('ok', 0)}/{part.counts.get('cases', 0)} ok in {part.wall_s:.0f} s",
                file=sys.stderr,
                flush=True,
            )

        timed("fuzz", lambda part: fuzz(part, tmp / "fuzz", model, args.cases, args.seed, args.timeout))
        reference: str | None = None
        failed_reference = ""
        store0 = tmp / "reference" / "store"
        if any(p in wanted for p in ("kill-resume", "damage", "concurrency")):
            began = time.monotonic()
            result, reference = run(workflow, store0, tmp / "reference" / "out", run_timeout)
            reference_s = time.monotonic() - began
            if reference is None:
                # the parts that compare with it have nothing to compare with: said, not counted
                failed_reference = f"the uninterrupted reference run failed (exit {result.code}): {_short(result)}"
                print(failed_reference, file=sys.stderr, flush=True)
            else:
                print(f"reference run: {reference_s:.1f} s, chose {reference[:12]}", file=sys.stderr, flush=True)
        if reference is not None:
            timed(
                "kill-resume", lambda part: kill_resume(part, tmp / "kills", workflow, reference, reference_s, args.kills, rng, run_timeout)
            )
            timed("damage", lambda part: damage(part, tmp / "damage", workflow, store0, reference, args.damage, run_timeout))
            timed("concurrency", lambda part: concurrency(part, tmp / "conc", model, args.concurrent, args.rounds, run_timeout))
        timed("bad models", lambda part: bad_model_runs(part, tmp, args.bad_models, run_timeout))
    table = rows(parts)
    wall = time.monotonic() - started
    print(render(table))
    print(
        f"wall {wall:.0f} s · seed {args.seed} · ok: no bug, hang, traceback or unexpected exit, and the part's own checks held; '-': not counted for that part"
    )
    print("each case counts once per column; concurrency's stale locks and verify ok count rounds")
    if failed_reference:
        print(f"kill-resume, damage and concurrency not run: {failed_reference}")
    for part in parts:
        if part.notes:
            print(f"\n{part.name}:")
            for text in sorted(part.notes)[: args.notes]:
                print(f"  {text}")
            if len(part.notes) > args.notes:
                print(f"  ... and {len(part.notes) - args.notes} more")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"seed": args.seed, "wall_s": round(wall, 1), "parts": table, "notes": {p.name: sorted(p.notes) for p in parts}}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
