"""How far a reader travels to follow one evaluation and one GRPO iteration through the trainer code.

Runs a 1-iteration GRPO on CartPole-v1 in-process and records, with ``sys.setprofile``, the project
source file that holds control at every Python call and return (standard library and site-packages
excluded). Two windows of that sequence are measured:

* evaluation: inside ``Evaluation.on_training_end`` (the final held-out evaluation as the run
  triggers it: episodes, metrics, the rows written back);
* GRPO iteration: from the first ``collect_groups`` call to the return of the first
  ``Run.end_iteration`` (collect, update, log, checkpoint).

Each call edge (calling function -> called function) is followed once, as a reader would: a loop's
second pass adds nothing. For each window: the distinct project files control passes through, the
file switches along that path, and the returns (control entering a file it had already left).
The same script runs unchanged on an older checkout (``--repo``), so a refactor is measured
before and after with one method:

    python -m benchmarks.code_paths                 # this checkout
    python benchmarks/code_paths.py --repo OTHER    # another checkout (its own trainers)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from nets.errors import program_name, run_cli

WINDOWS = {
    "evaluation": (("callbacks.py", "on_training_end", "Evaluation"), ("callbacks.py", "on_training_end")),
    "GRPO iteration": (("train.py", "collect_groups", None), ("run.py", "end_iteration")),
}


class PathRecorder:
    """The sequence of project files holding control, inside one window of the run."""

    def __init__(self, root: Path, start: tuple[str, str, str | None], stop: tuple[str, str]) -> None:
        self.root = str(root) + os.sep
        self.start, self.stop = start, stop
        self.files: list[str] = []
        self.open = False  # the window has started
        self.stack: list[bool] = []  # per open frame: was its call edge new
        self.edges: set[tuple[Any, Any]] = set()
        self.done = False

    def _project_file(self, frame: Any) -> str | None:
        path = frame.f_code.co_filename
        if not path.startswith(self.root) or f"{os.sep}.venv{os.sep}" in path:
            return None
        return path[len(self.root) :]

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.done or event not in ("call", "return"):
            return
        name = frame.f_code.co_name
        path = self._project_file(frame)
        if event == "call":
            caller = frame.f_back
            edge = (caller.f_code if caller else None, frame.f_code)
            new = edge not in self.edges
            self.edges.add(edge)
            self.stack.append(new)
        else:
            new = self.stack.pop() if self.stack else False
        if not self.open:
            file, func, cls = self.start
            owner = type(frame.f_locals.get("self")).__name__ if "self" in frame.f_locals else None
            if event == "call" and path and path.endswith(file) and name == func and cls in (None, owner):
                self.open = new = True
            else:
                return
        if path is not None and new:  # a call edge read for the first time (loops read once)
            caller = frame.f_back
            here = path if event == "call" else self._project_file(caller) if caller else None
            if here and (not self.files or self.files[-1] != here):
                self.files.append(here)
        file, func = self.stop
        if event == "return" and path and path.endswith(file) and name == func:
            self.done = True

    def summary(self) -> dict[str, int]:
        seen: set[str] = set()
        returns = 0
        for f in self.files:  # consecutive entries always differ
            returns += f in seen
            seen.add(f)
        return {"files": len(seen), "switches": max(len(self.files) - 1, 0), "returns": returns}


def measure(repo: Path) -> dict[str, tuple[dict[str, int], list[str]]]:
    """Each window's counts and files, from one 1-iteration GRPO run of ``repo``'s trainers."""
    recorders = {w: PathRecorder(repo, *WINDOWS[w]) for w in WINDOWS}
    from trainers.grpo import train as grpo_train

    def profile(frame: Any, event: str, arg: Any) -> None:
        for recorder in recorders.values():
            recorder(frame, event, arg)

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--env", "CartPole-v1", "--num-envs", "4", "--group-size", "4", "--max-iterations", "1",
                "--eval-episodes", "4", "--no-progress", "--no-video", "--run-dir", f"{tmp}/run"]  # fmt: skip
        sys.setprofile(profile)
        try:
            grpo_train.main(argv)
        finally:
            sys.setprofile(None)
    return {w: (r.summary(), sorted(set(r.files))) for w, r in recorders.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--files", action="store_true", help="list the files of each window")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    sys.path.insert(0, str(repo))
    measured = measure(repo)
    if args.files:
        for window, (_, files) in measured.items():
            print(f"{window}: " + ", ".join(files))
    print(f"| window ({repo.name}) | files | switches | returns to a file left |\n|---|---|---|---|")
    for window, (c, _) in measured.items():
        print(f"| {window} | {c['files']} | {c['switches']} | {c['returns']} |")


if __name__ == "__main__":
    run_cli(main)
