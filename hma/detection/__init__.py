"""Running probes: discovery (entry points, executables), isolated runs, workers, device events."""
