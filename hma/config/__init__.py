"""The configuration: files, drop-ins, the schema and its validation."""
