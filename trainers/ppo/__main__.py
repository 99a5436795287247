from nets.errors import run_cli
from trainers.ppo.train import main

run_cli(main)
