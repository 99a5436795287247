"""World-model envs: a learned video model stands in for the simulator (Cosmos, OpenSora)."""
