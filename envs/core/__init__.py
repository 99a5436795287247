"""The shared env contract: initial frames, the chunked vector env base, spaces, errors, workers."""

from envs.core.errors import ClosedEnvError
from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames
from envs.core.vector_env import ChunkedVectorEnv, ChunkResult

__all__ = [
    "ChunkResult",
    "ChunkedVectorEnv",
    "ClosedEnvError",
    "InitialFrame",
    "load_initial_frames",
    "save_initial_frames",
]
