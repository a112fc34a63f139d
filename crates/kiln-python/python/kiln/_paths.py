"""Argument checks shared by the submodules."""

import os


def existing_dir(path, what):
    """`path` as a string, or FileNotFoundError naming `what` when it is not a directory."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r}: no such directory")
    return path
