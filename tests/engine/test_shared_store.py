"""Which stores a cluster of several hosts may share: their locks must hold across hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.errors import InputError
from engine.execute.shared_store import check_shared_store, why_not_shared

MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
server:/kiln /mnt/nfs4 nfs4 rw,vers=4.2 0 0
server:/old /mnt/nfs3 nfs rw,vers=3,nolock 0 0
//server/share /mnt/smb cifs rw 0 0
"""


@pytest.mark.parametrize(
    ("root", "refused"),
    [("/mnt/nfs4/store", False), ("/var/store", False), ("/mnt/nfs3/store", True), ("/mnt/smb/store", True)],
)
def test_the_stores_mount_says_whether_its_locks_hold_across_hosts(root, refused):
    assert (why_not_shared(Path(root), MOUNTS) is not None) is refused


def test_several_hosts_refuse_a_store_they_cannot_lock_and_one_host_shares_any():
    check_shared_store(Path("/mnt/smb/store"), {"one"}, MOUNTS)
    with pytest.raises(InputError, match="cifs"):
        check_shared_store(Path("/mnt/smb/store"), {"one", "two"}, MOUNTS)
