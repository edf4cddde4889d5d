"""AutoML procedures on model hopper parallelism (pure; see :mod:`.base`)."""
