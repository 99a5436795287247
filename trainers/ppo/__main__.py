from trainers.ppo.train import main

main()
