"""Agentic rollouts: several assistant turns per sample, with tool calls in between
(:mod:`verl.agent.agent_loop`), parsed from the model's text by :mod:`verl.agent.parsers`."""
