"""AWS Neuron devices (sysfs counters)."""
