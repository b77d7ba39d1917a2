"""The doors: each protocol's adapter over the kit and the data plane."""
