"""benchmarks/results/ set aside from what the device calls carry, and back; the files never move.

    python -m benchmarks.gpu_kit aside     # before `build`: the result sets leave what every call carries
    python -m benchmarks.gpu_kit back      # after the calls: as it was

Every call to a lent machine carries the checkout as the device tool lists it, the files git tracks (its index) and
those it does not ignore, and the result sets are most of this project's (10 of 13.5 MiB): 10 MiB less room for the
kit in each call, a call more for the whole kit. `aside` takes the folder out of the index (`git rm -r --cached`) and
ignores it locally (.git/info/exclude, never committed), so neither list names it while the files stay where they are;
`back` puts the index entries back from HEAD (`git reset`) and removes the exclude line. `aside` refuses while the
folder has changes of its own (commit them first: `back` restores what HEAD has). Build the kit after `aside`: it
measures the checkout as it is then, and the plan says what it counted.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.gpu_kit.contents import NOT_CARRIED, REPO
from benchmarks.gpu_kit.wheels import KitError

FOLDER = NOT_CARRIED[0].rstrip("/")  # benchmarks/results
LINE = f"/{FOLDER}/"  # its pattern in .git/info/exclude


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode:
        raise KitError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def exclude_file(repo: Path) -> Path:
    path = Path(git(repo, "rev-parse", "--git-path", "info/exclude").strip())
    return path if path.is_absolute() else repo / path  # relative to the work tree's root


def is_aside(repo: Path = REPO) -> bool:
    exclude = exclude_file(repo)
    return exclude.is_file() and LINE in exclude.read_text().splitlines()


def aside(repo: Path = REPO) -> str:
    if is_aside(repo):
        return f"{FOLDER}/ is set aside already"
    if changed := git(repo, "status", "--porcelain", "--", FOLDER).strip():
        raise KitError(f"{FOLDER}/ has changes of its own ({len(changed.splitlines())}): commit them before `aside`")
    git(repo, "rm", "-r", "-q", "--cached", "--", FOLDER)
    exclude = exclude_file(repo)
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.is_file() else ""
    exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + LINE + "\n")
    return f"{FOLDER}/ set aside: out of git's index and ignored here; the files stay (`back` undoes it)"


def back(repo: Path = REPO) -> str:
    exclude = exclude_file(repo)
    if exclude.is_file():
        lines = exclude.read_text().splitlines()
        exclude.write_text("".join(f"{line}\n" for line in lines if line != LINE))
    git(repo, "reset", "-q", "--", FOLDER)
    return f"{FOLDER}/ back in git's index as HEAD has it"
