"""Built-in event sources, installed as the subpackage ``hma.sources``."""
