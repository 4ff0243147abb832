"""A folder a pass keeps in the store's pass cache, with its digest beside it.

``<folder>.digest`` holds the folder's content digest (``digest_tree``), written last: a folder
is served only while its files still give that digest, and one that does not is made again.
A folder is filled under a scratch name and renamed into place whole, so a crash or a kill never
leaves half of one where a later job would look. Used by the decoder passes' factory folders
(passes.generate._common) and NNCF's shared calibration (passes.openvino._nncf_shared).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.core import digest_tree


def stamp_of(folder: Path) -> Path:
    return folder.with_name(f"{folder.name}.digest")


def checked(folder: Path, kind: str) -> bool:
    """``folder`` is there and its files still give the digest stamped beside it."""
    stamp = stamp_of(folder)
    return folder.is_dir() and stamp.is_file() and stamp.read_text().strip() == digest_tree(folder, kind)


def keep(folder: Path, kind: str, fill: Callable[[Path], object]) -> bool:
    """``fill(scratch)`` writes the folder's files under a scratch name, renamed to ``folder``
    whole (replacing one that failed its check), then its digest is stamped beside it. False,
    with nothing kept, where another job put the folder in place first."""
    staged = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(staged, ignore_errors=True)
    fill(staged)
    shutil.rmtree(folder, ignore_errors=True)  # a folder that failed its check
    try:
        os.replace(staged, folder)
    except OSError:  # another job put the same folder in place first
        shutil.rmtree(staged, ignore_errors=True)
        return False
    stamp = stamp_of(folder)
    part = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    part.write_text(digest_tree(folder, kind))
    os.replace(part, stamp)
    return True
