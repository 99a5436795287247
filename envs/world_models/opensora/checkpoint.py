"""Moved to ``nets.opensora_checkpoint`` (the trainer ``trainers.world_model`` builds the same networks, and
``trainers`` never imports ``envs``). This old path is that module itself, not a copy: patching a name
through either path patches both."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("nets.opensora_checkpoint")
