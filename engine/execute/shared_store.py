"""Whether the artifact store can be shared by a cluster's hosts: its jobs' locks (``flock`` per
key, engine.store.locks) must hold across hosts, or two nodes build the same key at once.

``flock`` holds across hosts on a file system that forwards it to a lock manager: NFSv4, and
NFSv3 with lockd (mounted without ``nolock`` or ``local_lock=flock``/``all``). It is local to one
host on SMB/CIFS, sshfs, 9p, VirtualBox shared folders and the object-store FUSE mounts. A
cluster of one host shares any local file system. Kiln reads the store's mount from
/proc/mounts (Linux; elsewhere it checks nothing) and refuses the store, before any job, when
the cluster spans several hosts and the store's locks would not hold across them.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.core.errors import InputError, Problem

#: file systems whose flock one host alone sees
LOCAL_LOCKS = ("cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "vboxsf", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.mountpoint-s3")


def store_mount(root: Path, mounts: str | None = None) -> tuple[str, str, list[str]] | None:
    """(mount point, file system type, options) of the mount holding ``root``; None when unknown."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8")
        except OSError:
            return None
    path, best = os.path.realpath(root), None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (best is None or len(point) > len(best[0])):
            best = (point, fields[2], fields[3].split(","))
    return best


def why_not_shared(root: Path, mounts: str | None = None) -> str | None:
    """Why the store's locks would not hold across hosts, or None."""
    mount = store_mount(root, mounts)
    if mount is None:
        return None
    point, kind, options = mount
    if kind in LOCAL_LOCKS:
        return f"it is on {kind} ({point}), whose locks only one host sees"
    if kind.startswith("nfs") and ("nolock" in options or "local_lock=flock" in options or "local_lock=all" in options):
        return f"it is on NFS mounted with {'nolock' if 'nolock' in options else 'local_lock'} ({point}): its locks stay on each host"
    return None


def check_shared_store(root: Path, hosts: set[str], mounts: str | None = None) -> None:
    """Refuse a store a cluster of several ``hosts`` cannot lock (bad input, exit 2)."""
    if len(hosts) < 2:
        return
    why = why_not_shared(root, mounts)
    if why is not None:
        raise InputError(
            [
                Problem(
                    where="--store (or cache.dir)",
                    message=f"cannot be shared by the cluster's {len(hosts)} hosts: {why}",
                    expected="a local file system (one host) or NFSv4 / NFSv3 with lockd, mounted at the same path on every node",
                    given=str(root),
                    hint="put the store on NFSv4 (see docs/cluster.md)",
                )
            ]
        )
