"""The live world: real engines (and later trainers) as Ray actors, one process each."""
