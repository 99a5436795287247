"""BEHAVIOR-1K (OmniGibson) challenge tasks as chunked vector envs.

``B1K-v0`` takes the task as a kwarg (``gym.make_vec("B1K-v0", task="turning_on_radio")``); each of
the 50 challenge tasks also has its own id (``B1K-TurningOnRadio-v0``, ``envs.b1k.tasks.task_env_id``).
Importing this package, listing the ids and building the spaces need no OmniGibson; making an env
without it raises ``B1KUnavailableError`` naming what is missing. OmniGibson needs Isaac Sim and an
RTX GPU, so it has never run here: the adapter is tested against ``tests/fake_omnigibson.py``.
"""

from envs.b1k.tasks import CHALLENGE_TASKS, task_env_id
from envs.core.registration import register_env

ENTRY_POINT = "envs.b1k.env:B1KVectorEnv"


def register() -> None:
    register_env("B1K-v0", ENTRY_POINT)
    for task in CHALLENGE_TASKS:
        register_env(task_env_id(task), ENTRY_POINT, task=task)
