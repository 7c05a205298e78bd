"""Adapters that serve attnmeta-compiled backends to serving engines."""
