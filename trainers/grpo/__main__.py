from trainers.grpo.train import main

main()
