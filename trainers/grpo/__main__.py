from nets.errors import run_cli
from trainers.grpo.train import main

run_cli(main)
