"""The asynchronous actor-learner (``--loop async``) that SAC and self-imitation share.

An ``EnvActor`` process owns the envs (local simulator workers, or Ray env actors when
``env_kwargs`` ask for them) and a copy of the policy; the learner's process owns the training data
(SAC's replay buffer, self-imitation's successes), the optimizer and the update:

    actor process:   [snapshot v] act -> env.step -> the algorithm's rows --queue--> learner process
    learner process: queue -> its data -> updates -> publish v'

* ``link.py``: what the two processes share: one shared-memory copy of the policy's weights, its
  version, and the counters; ``LaggedPolicy`` acts with weights at most ``max_policy_lag`` learner
  updates old (exact: the check and the choice hold the same lock).
* ``process.py``: the actor process: it makes the envs, reports their spaces, waits for the policy,
  then runs the algorithm's actor loop (``trainers/sac/actors.py``, ``trainers/sil/actors.py``);
  errors come back to the learner with their type, and it dies with its learner.

The loops are not bit-exact: the order in which data and updates meet depends on timing.
"""

from trainers.actors.link import ActorLink, LaggedPolicy, module_weights
from trainers.actors.process import ActorSpec, EnvActor

__all__ = ["ActorLink", "ActorSpec", "EnvActor", "LaggedPolicy", "module_weights"]
