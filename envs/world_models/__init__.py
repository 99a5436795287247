"""World-model envs: a learned video model stands in for the simulator (Cosmos, OpenSora).

Importing this package is cheap; torch and diffusers load when an env is built.
"""

from envs.core.registration import register_env

# id -> (vector entry point, keyword arguments)
WORLD_MODEL_IDS = {
    "CosmosWM-LiberoSpatial-v0": ("envs.world_models.cosmos.env:CosmosWorldModelEnv", {"suite": "spatial"}),
    "OpenSoraWM-LiberoSpatial-v0": (
        "envs.world_models.opensora.env:OpenSoraWorldModelEnv",
        {"suite": "spatial"},
    ),
    "OpenSoraWM-LiberoObject-v0": (
        "envs.world_models.opensora.env:OpenSoraWorldModelEnv",
        {"suite": "object"},
    ),
}


def register() -> None:
    for env_id, (entry_point, kwargs) in WORLD_MODEL_IDS.items():
        register_env(env_id, entry_point, **kwargs)
