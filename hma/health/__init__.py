"""The health model (pure), the state store and the pipeline that applies verdicts to it."""
