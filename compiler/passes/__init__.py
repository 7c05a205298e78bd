"""Passes: each a named ``(Graph, PassContext) -> Graph`` function in its own file."""
