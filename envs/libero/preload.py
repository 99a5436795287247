"""Imported by multiprocessing's forkserver before it forks LIBERO workers (``LiberoVectorEnv``,
``warm_forkserver=True``).

It sets the rendering variables every LIBERO worker uses, imports robosuite and LIBERO, and builds
and drops one LIBERO-Spatial scene (state only: no GL context is made). Workers forked afterwards
start with what that leaves in the server's memory: the imported modules, robosuite's numba
functions, and MuJoCo's in-process asset cache (decoded textures, compiled meshes), so a worker's
first scene builds in about 1 s instead of 3-4 s. The server pays this once, about 7 s on 2 cores.
Models compiled from the cache are the same as without it. It never raises: a failure here only
costs the speed-up.
"""

from __future__ import annotations

import gc
import os
import sys

try:
    # as _worker_environ sets them: robosuite picks its GL backend when imported, here
    os.environ.update(MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl")
    from envs.libero.sim import _import_libero, _Scene
    from envs.libero.suites import suite_tasks

    _import_libero()
    _Scene(suite_tasks("spatial")[0]).close()
    gc.collect()  # robosuite envs are reference cycles
except Exception as error:  # noqa: BLE001 - a failed warm-up must not stop the forkserver
    print(f"vla-gym: LIBERO forkserver warm-up failed ({error!r}); workers start without it", file=sys.stderr)
