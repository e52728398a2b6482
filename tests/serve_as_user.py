"""``queen serve`` as another user: ``python serve_as_user.py <uid> <gid>``.

The interpreter running the tests may live where only root can read (a Python installed under
``/root``), so the broker's modules are imported first; then the process gives up root for
good and everything the broker does (directories, spool files, the embedded PostgreSQL) is
done as that user. With the caller's own uid nothing is switched.
"""

from __future__ import annotations

# Standard modules the broker imports lazily, loaded while they can still be read.
import encodings.idna  # noqa: F401
import importlib.readers  # noqa: F401
import os
import sys

import queen.cli
import queen.server  # imported before root is given up


def main() -> int:
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    if os.getuid() != uid:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    return queen.cli.main(["serve"])


if __name__ == "__main__":
    sys.exit(main())
