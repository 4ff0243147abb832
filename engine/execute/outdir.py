"""The output folder a run writes: what marks one Kiln wrote, and the check made before anything
runs (a light module: ``engine run`` checks the folder before it imports the rest of the engine)."""

from __future__ import annotations

from pathlib import Path

from engine.core.errors import InputError, Problem

#: what a folder Kiln wrote holds at its top; a folder holding anything else is not replaced
OUTPUT_MARKERS = ("candidates.json", "workflow.lock.json", "events.jsonl")


def is_partial_event_log(name: str) -> bool:
    """``.events.jsonl.<id>.tmp``: the event log of a run still going, or of one killed before it
    ended (engine.execute.hooks.EventLog): Kiln's own file, so its folder is Kiln's to replace."""
    return name.startswith(".events.jsonl.") and name.endswith(".tmp")


def check_output_dir(output_dir: Path) -> None:
    """Refuse, before anything runs, an output folder that holds files Kiln did not write: the
    outputs replace the folder as a whole."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise InputError([Problem(where="--output", message="is not a folder", given=str(output_dir), hint="name a folder")])
    names = {p.name for p in output_dir.iterdir()}
    if names and not names & set(OUTPUT_MARKERS) and not any(is_partial_event_log(name) for name in names):
        raise InputError(
            [
                Problem(
                    where="--output",
                    message="holds files that are not the outputs of a Kiln run; Kiln replaces its output folder as a whole",
                    expected=f"a new or empty folder, or one an earlier run wrote ({', '.join(OUTPUT_MARKERS)})",
                    given=f"{output_dir} with {', '.join(sorted(names)[:5])}",
                    hint="choose another --output (or output.dir), or empty that folder",
                )
            ]
        )
