"""Tools a model calls during multi-turn rollouts: verl's tool classes (:mod:`verl.tools.base_tool`,
declared in a tool YAML) and plain Python functions (:mod:`verl.tools.function_tool`)."""
