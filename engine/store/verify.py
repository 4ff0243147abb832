"""``engine verify``: check every object and key record of a store, fully; optionally repair.

Repairing only removes: a damaged object, a record that cannot be served, and a record pointing at
a damaged or missing object. The next run recomputes what was removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.store.store import Store


@dataclass
class VerifyReport:
    objects_ok: int = 0
    records_ok: int = 0
    bad_objects: dict[str, str] = field(default_factory=dict)  # digest -> why
    bad_records: dict[str, str] = field(default_factory=dict)  # key -> why
    removed: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.bad_objects and not self.bad_records


def verify_store(store: Store, repair: bool = False) -> VerifyReport:
    report = VerifyReport()
    if store.objects.is_dir():
        for folder in sorted(store.objects.iterdir()):
            why = store.check_object(folder.name, full=True) if folder.is_dir() else "is not a folder"
            if why:
                report.bad_objects[folder.name] = why
            else:
                report.objects_ok += 1
    if store.keys.is_dir():
        for path in sorted(store.keys.glob("*.json")):
            key = path.stem
            record, why = store.read_record(key)
            digest = (record or {}).get("digest")
            if record is not None and digest:
                if digest in report.bad_objects:
                    why = f"points at damaged object {digest}"
                elif not store.object_path(digest).is_dir():
                    why = f"points at missing object {digest}"
            if why:
                report.bad_records[key] = why
            else:
                report.records_ok += 1
    if repair:
        for digest in report.bad_objects:
            store.discard_object(digest)
            report.removed.append(f"objects/{digest}")
        for key in report.bad_records:
            store.key_path(key).unlink(missing_ok=True)
            report.removed.append(f"keys/{key}.json")
        store.clean_stale_staging()
    return report
