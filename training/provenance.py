"""Where a checkpoint came from: the exact command, the commit, the code that ran, the hardware.

A commit alone is only as good as the ``.git`` beside the files: a checkout copied to another machine with an
older ``.git`` names a commit the files are not (the H200 runs of 2026-11-28 did). So every training piece also
records :func:`code_sha256`, a hash of the files that decide the weights, read from the working tree and from no
git metadata, and :func:`code_record` checks at once whether the commit's own files hash to it. Later,
:func:`check_commit` says of any recorded pair whether the commit is the code that ran, and if not
:func:`find_code_commit` names the commit whose files do.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["command_line", "from_scratch", "git_commit", "hardware", "on_cpu", "sha256_file", "code_sha256",
           "tree_manifest", "commit_manifest", "manifest_sha256", "code_record", "check_commit", "find_code_commit",
           "CODE_DIRS", "CODE_SUFFIXES", "CODE_HASH_SINCE"]

REPO = Path(__file__).resolve().parent.parent
CODE_DIRS = ("models", "training")
# Source files, Python and the C++ of the CPU kernels (models/cpu/*.cpp), which compute forward passes too.
CODE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")
# The first day a card's pieces could record a code hash: older pieces have a commit only.
CODE_HASH_SINCE = "2026-11-28"
SHOWN = 12  # hex digits of a commit or a hash in a message
LISTED = 4  # differing files named in a note


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it from the repo root."""
    argv = sys.argv[1:] if argv is None else argv
    return "python -m training " + " ".join(shlex.quote(arg) for arg in argv)


def from_scratch(command: str) -> str:
    """The command that trains the same run from scratch: ``command`` without its ``--resume`` flag and without
    a ``--time-limit`` (which cuts a call short, not the run)."""
    words, kept = iter(shlex.split(command)), []
    for word in words:
        if word == "--time-limit":
            next(words, None)
        elif word != "--resume" and not word.startswith("--time-limit="):
            kept.append(word)
    return shlex.join(kept)


def git_commit(root: Path = REPO) -> str:
    """HEAD of the repo, with ``+dirty`` when the code that decides the weights differs from it.

    That code is ``models/`` and ``training/`` (untracked files there count too); edits
    elsewhere (the app, docs) do not change what a run computes. ``unknown`` outside git.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *CODE_DIRS], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _is_code(path: str) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is one of the files :func:`code_sha256` hashes."""
    parts = path.split("/")
    return (len(parts) > 1 and parts[0] in CODE_DIRS and parts[-1].endswith(CODE_SUFFIXES)
            and not any(part == "__pycache__" or part.startswith(".") for part in parts))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_manifest(root: Path = REPO) -> dict[str, str]:
    """The hex sha256 of every file :func:`code_sha256` hashes in the working tree at ``root``, by relative path."""
    root = Path(root)
    manifest = {}
    for top in CODE_DIRS:
        for folder, dirs, files in os.walk(root / top):
            dirs[:] = [name for name in dirs if name != "__pycache__" and not name.startswith(".")]
            for name in files:
                path = (Path(folder) / name).relative_to(root).as_posix()
                if _is_code(path):
                    try:
                        manifest[path] = _sha256((Path(folder) / name).read_bytes())
                    except FileNotFoundError:  # deleted while the tree is read: it is not part of what runs
                        continue
    return manifest


def manifest_sha256(manifest: dict[str, str]) -> str:
    """The hash of a manifest: sha256 of its ``sha256sum`` listing (``DIGEST  PATH`` lines, sorted by path)."""
    return _sha256("".join(f"{manifest[path]}  {path}\n" for path in sorted(manifest)).encode())


def code_sha256(root: Path = REPO) -> str:
    """Hex sha256 naming the code that decides the weights, as the files at ``root`` are now.

    The files: every regular file under ``models/`` and ``training/`` (any depth) whose name ends in one of
    :data:`CODE_SUFFIXES`, except in ``__pycache__`` folders and hidden files or folders (a leading dot).
    Tracked or not, and whatever git would ignore (its ignore rules there cover only ``__pycache__``).
    The hash: sha256 of the listing ``sha256sum`` prints for those files, one ``DIGEST  PATH`` line each, paths
    relative to ``root`` with ``/``, sorted by path; from the repo root the shell gives the same::

        find models training -type f \\( -name '*.py' -o -name '*.cpp' \\) ! -path '*/__pycache__/*' \\
            | LC_ALL=C sort | xargs sha256sum | sha256sum

    (the names with the other suffixes, were there any). It reads only file bytes: no git, no modification
    times, not where the tree lies, so a copy of the tree anywhere hashes the same; the files of a commit hash
    the same way (:func:`commit_manifest`) as long as git applies no line-ending or other filter to them.
    """
    return manifest_sha256(tree_manifest(root))


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, check=True).stdout


def _resolve(commit: str, root: Path) -> str | None:
    """The full hash of ``commit`` (a hex prefix, or ``HEAD``) when it is a commit of the repo at ``root``."""
    if commit != "HEAD" and not re.fullmatch(r"[0-9a-f]{4,64}", commit):
        return None
    try:
        return _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").decode().strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def commit_manifest(commit: str, root: Path = REPO, blobs: dict[str, str] | None = None) -> dict[str, str] | None:
    """:func:`tree_manifest` of the files at ``commit`` (read with ``git ls-tree`` and ``git cat-file``), or None
    when ``commit`` is not a commit of the repo at ``root`` (or there is no git).

    Args:
        commit: a commit hash (or a prefix of at least 4 hex digits) or ``HEAD``.
        root: the repo's top folder.
        blobs: a cache of blob id -> sha256 of its bytes, shared between calls over many commits.
    """
    blobs = {} if blobs is None else blobs
    full = _resolve(commit, Path(root))
    if full is None:
        return None
    try:
        listing = _git(root, "ls-tree", "-r", "-z", full, "--", *CODE_DIRS)
        wanted = {}
        for entry in filter(None, listing.split(b"\0")):
            meta, path = entry.split(b"\t", 1)
            _, kind, blob = meta.decode().split()
            if kind == "blob" and _is_code(path.decode()):
                wanted[path.decode()] = blob
        missing = sorted(set(wanted.values()) - set(blobs))
        if missing:
            out = _git(root, "cat-file", "--batch", stdin="".join(f"{blob}\n" for blob in missing).encode())
            at = 0
            for blob in missing:  # each object: "<id> blob <size>\n" then its bytes and "\n"
                header_end = out.index(b"\n", at)
                size = int(out[at:header_end].split()[2])
                blobs[blob] = _sha256(out[header_end + 1:header_end + 1 + size])
                at = header_end + 1 + size + 1
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):  # no git, or output not understood
        return None
    return {path: blobs[blob] for path, blob in wanted.items()}


def _differences(ran: dict[str, str], committed: dict[str, str]) -> str:
    """Which files differ between the files that ran and a commit's, named up to :data:`LISTED` of each kind."""
    kinds = (("changed", [p for p in sorted(ran) if p in committed and ran[p] != committed[p]]),
             ("not in the commit", [p for p in sorted(ran) if p not in committed]),
             ("only in the commit", [p for p in sorted(committed) if p not in ran]))
    return "; ".join(f"{kind}: {', '.join(paths[:LISTED])}" + (f" and {len(paths) - LISTED} more"
                                                               if len(paths) > LISTED else "")
                     for kind, paths in kinds if paths)


def code_record(root: Path = REPO) -> dict:
    """What a training piece records of its code: ``commit`` (:func:`git_commit`), ``code_sha256`` and
    ``commit_check``, which says whether the commit's files of models/ and training/ are the ones that ran.

    ``commit_check`` starts with ``verified`` or ``unverified``: a dirty tree, or a ``.git`` copied with the
    files but older than them, leaves the commit unverified and the note names the files that differ; then
    ``code_sha256`` alone names the code. Costs one read of the files and two git calls (tens of ms).
    """
    ran = tree_manifest(root)
    record = {"commit": git_commit(root), "code_sha256": manifest_sha256(ran)}
    committed = commit_manifest("HEAD", root)
    if committed is None:
        record["commit_check"] = "unverified: no git history here to check the commit against; code_sha256 " \
                                 "alone names the code that ran"
    elif committed == ran:
        record["commit_check"] = "verified: the commit's files of models/ and training/ are the ones that ran " \
                                 "(they hash to code_sha256)"
    else:
        record["commit_check"] = (f"unverified: the files of models/ and training/ that ran are not the commit's "
                                  f"({_differences(ran, committed)}); code_sha256 alone names the code that ran")
    return record


def check_commit(commit: str | None, code_hash: str | None, root: Path = REPO) -> str:
    """Whether a recorded ``commit`` is the code that ran, as recorded by ``code_hash`` (a :func:`code_sha256`).

    Args:
        commit: the recorded commit, possibly ``HASH+dirty``, ``unknown`` or None.
        code_hash: the recorded code hash; None for pieces trained before :data:`CODE_HASH_SINCE`.
        root: the repo whose history holds the commit.

    Returns:
        One sentence: ``commit C verified: ...``, ``commit C does not match the code that ran: ...`` (then
        the commit is stale, or its ``+dirty`` edits were never committed), ``commit C is not in this
        repository's history: ...``, or ``no code hash recorded (made before code hashes, DATE)``.
    """
    if not code_hash:
        return f"no code hash recorded (made before code hashes, {CODE_HASH_SINCE})"
    base = (commit or "").removesuffix("+dirty")
    if not base or base == "unknown":
        return f"no commit recorded; code_sha256 {code_hash[:SHOWN]} alone names the code that ran"
    committed = commit_manifest(base, root)
    if committed is None:
        return f"commit {base[:SHOWN]} is not in this repository's history: cannot check it against code_sha256"
    found = manifest_sha256(committed)
    if found == code_hash:
        return f"commit {base[:SHOWN]} verified: its files of models/ and training/ hash to the recorded code_sha256"
    why = ("the code that ran had edits never committed as such, or a stale .git" if commit.endswith("+dirty")
           else "the recorded commit is stale")
    return (f"commit {base[:SHOWN]} does not match the code that ran: its files of models/ and training/ hash to "
            f"{found[:SHOWN]}, the recorded code_sha256 is {code_hash[:SHOWN]}; {why}")


def find_code_commit(code_hash: str, root: Path = REPO) -> str | None:
    """The oldest commit in HEAD's history whose files of models/ and training/ hash to ``code_hash``, or None.

    Only commits that change those folders are read (the others repeat their parent's files): about a second
    for a few hundred, the blobs they share hashed once.
    """
    try:
        commits = _git(Path(root), "log", "--format=%H", "HEAD", "--", *CODE_DIRS).decode().split()
    except (OSError, subprocess.CalledProcessError):
        return None
    blobs: dict[str, str] = {}
    match = None
    for commit in commits:  # newest first: the last match is the oldest
        manifest = commit_manifest(commit, root, blobs)
        if manifest is not None and manifest_sha256(manifest) == code_hash:
            match = commit
    return match


def hardware(device: torch.device, processes: int = 1) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
        name += f", {torch.get_num_threads()} threads"
    return f"{processes} x {name}" if processes > 1 else name


def on_cpu(hardware_text: str) -> bool:
    """Whether a :func:`hardware` string names a CPU (its name and threads) rather than a GPU."""
    return hardware_text.endswith(" threads")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks: what names a checkpoint or a source image in a record."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
