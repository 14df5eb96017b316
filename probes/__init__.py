"""Built-in probes, installed as the subpackage ``hma.probes``."""
