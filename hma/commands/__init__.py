"""The hma subcommands: one module per verb of the command line."""
