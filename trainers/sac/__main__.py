from trainers.sac.train import main

main()
