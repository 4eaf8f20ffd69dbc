"""What an install of the provider must contain, derived from setup.cfg (the one place that maps folders)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "exactly_once_provider"


def package_dirs() -> dict[str, Path]:
    """setup.cfg's ``package_dir``: import package -> the repository folder it is built from."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    dirs = {}
    for line in setup["options"]["package_dir"].strip().splitlines():
        package, folder = (part.strip() for part in line.split("=", 1))
        dirs[package] = REPO / folder
    assert PACKAGE in dirs, dirs
    return dirs


def shipped_modules() -> dict[str, Path]:
    """Every Python file an install must hold, as its path inside site-packages -> its source file.

    Every ``.py`` below each mapped folder counts, sub-folders included, so a new sub-package of provider/
    that setup.cfg's ``packages`` forgets to list is missing from the install and fails the caller.
    """
    modules = {}
    for package, folder in package_dirs().items():
        for source in folder.rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            inside = source.relative_to(folder).as_posix()
            modules[f"{package.replace('.', '/')}/{inside}"] = source
    return modules


def clean_copy(dest: Path) -> Path:
    """Copy the files a fresh clone would have (plus new, not ignored ones) to ``dest``; return it.

    Builds run from the copy: setuptools reuses the checkout's ``build/`` and ``*.egg-info/`` (its old file
    list counts as package data), which hid a sub-package missing from setup.cfg, and parallel builds in one
    checkout race on them.
    """
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest
