"""Networks shared by ``envs`` and ``policies``: the Cosmos-Predict2 video DiT (``cosmos_dit``), which
the Cosmos world-model env and the Cosmos Policy both host, and the Wan 2.1 VAE (``wan_vae``) both
encode frames with, and ``safe_load``, how every package reads pickle-based files without running
code from them. Depends on torch (and diffusers for the VAE) only; imports none of the others."""
