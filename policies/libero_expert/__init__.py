"""The scripted LIBERO pick-and-place expert (reads the env's privileged ``task_state``)."""

from .machine import PickPlaceMachine
from .policy import LiberoExpert, unpack_task_state

__all__ = ["LiberoExpert", "PickPlaceMachine", "unpack_task_state"]
