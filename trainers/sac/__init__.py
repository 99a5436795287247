"""Soft actor-critic over action chunks, with the options of RLPD and Q-chunking: ``algorithm``
holds the config and one gradient step, ``critic`` the Q ensemble, ``replay`` the buffer and the
n-step chunk returns, ``prior`` the prior data (demonstrations, earlier runs), ``train`` the loop
and the command line (``python -m trainers.sac --help``)."""

from trainers.sac.algorithm import Learner, SACConfig, make_optimizer, sac_update
from trainers.sac.critic import QEnsemble
from trainers.sac.replay import NStepWriter, ReplayBuffer

__all__ = ["Learner", "NStepWriter", "QEnsemble", "ReplayBuffer", "SACConfig", "make_optimizer", "sac_update"]
