"""The challenge's partial-success score from goal-predicate truth values (pure Python).

A BDDL goal is a disjunction of groundings, each a list of predicates. With ``initial[g][j]`` and
``final[g][j]`` the truth of predicate j of grounding g at the episode's start and end:

    q = 1                                                             if the task succeeded
    q = max_g  #{j : not initial[g][j] and final[g][j]} / len(grounding g)   otherwise

so a predicate already true at the start never earns credit (BEHAVIOR-1K ``TaskMetric``).
"""

from __future__ import annotations

from collections.abc import Sequence

from nets.errors import BadInput


def q_score(initial: Sequence[Sequence[bool]], final: Sequence[Sequence[bool]], success: bool) -> float:
    """Partial success in [0, 1] (see the module docstring)."""
    if len(initial) != len(final):
        raise BadInput(f"q_score: {len(initial)} initial groundings but {len(final)} final ones")
    if success:
        return 1.0
    best = 0.0
    for g, (start, end) in enumerate(zip(initial, final)):
        if len(start) != len(end):
            raise BadInput(f"q_score: grounding {g} has {len(start)} initial and {len(end)} final predicates")
        if start:
            gained = sum(1 for was, now in zip(start, end) if not was and now)
            best = max(best, gained / len(start))
    return best
