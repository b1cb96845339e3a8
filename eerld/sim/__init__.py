"""The simulated GPU and RL workload of docs/simulator.md (the shared sim-model spec)."""
