"""DeepSeek-V4's compressed metadata: its spec (``spec.py``, with ``compress.py`` and ``indexer.py``) and its
eager twin (``eager.py``)."""
