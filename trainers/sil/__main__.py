from nets.errors import run_cli
from trainers.sil.train import main

run_cli(main)
