"""The health model (pure), the state store's engine, the modules that own its tables on the
health side (records, history, maintenance mode) and the pipeline that applies verdicts."""
