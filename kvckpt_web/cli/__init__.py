"""The ``kvckpt`` command line and the programs it runs: demo, benchmarks, soak."""
