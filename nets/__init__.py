"""Networks shared by ``envs``, ``policies`` and ``trainers``: the Cosmos-Predict2 video DiT
(``cosmos_dit``), which the Cosmos world-model env and the Cosmos Policy both host, the Wan 2.1 VAE
(``wan_vae``) both encode frames with, the OpenSora STDiT3, its SDXL VAE, RFLOW sampler, loader and tiny
checkpoints (``opensora_*``), which the OpenSora world-model env runs and ``trainers.world_model`` trains,
the world models' ResNet-18 success classifier
(``resnet_rm``), which the world-model envs score frames with and ``trainers.reward_model`` trains,
``safe_load``, how every package reads pickle-based files without running code from them, and the
ground-floor helpers every package shares: ``files`` (atomic writes of files and folders, fsynced,
never through a symbolic link; no torch), ``devices`` (``parse_dtype``, ``default_device``) and
``processes`` (child processes that start cleanly and die with their parent).
Depends on torch (and diffusers for the VAE) only; imports none of the others."""
