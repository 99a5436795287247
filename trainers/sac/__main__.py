from nets.errors import run_cli
from trainers.sac.train import main

run_cli(main)
