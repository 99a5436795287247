"""Self-imitation from success (filtered behaviour cloning, the policy-improvement step of expert
iteration): the policy collects episodes with sampled actions, the chunk-steps of those that succeed
join a buffer, and the policy is trained by its imitation loss on minibatches that mix that buffer
with prior demonstrations. Under a 0/1 success reward this is reward-weighted regression: it ascends
the success rate, with any policy that has an ``imitation_loss`` (Gaussian, flow, the VLAs).

``algorithm`` holds the config, the success buffer and one gradient step; ``train`` the loop and the
command line (``python -m trainers.sil --help``, or ``python -m trainers --algo sil``).
"""

from trainers.sil.algorithm import ChunkRows, SILConfig, sil_update

__all__ = ["SILConfig", "ChunkRows", "sil_update"]
