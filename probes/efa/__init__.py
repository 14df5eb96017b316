"""EFA: adapters (sysfs) and the ping-mesh."""
