"""LIBERO (hf-libero 0.1.4, robosuite 1.4, MuJoCo) as chunked vector envs.

Importing this package is cheap: the simulator is imported inside the worker processes.
"""

from envs.core.registration import register_env

SUITE_IDS = {
    "Libero-Spatial-v0": "spatial",
    "Libero-Object-v0": "object",
    "Libero-Goal-v0": "goal",
    "Libero-10-v0": "10",
    "Libero-90-v0": "90",
    "Libero-130-v0": "130",
}


def register() -> None:
    for env_id, suite in SUITE_IDS.items():
        register_env(env_id, "envs.libero.env:LiberoVectorEnv", suite=suite)
