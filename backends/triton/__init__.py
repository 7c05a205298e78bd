"""SGLang's Triton attention backend: its spec (``spec.py``) and its eager twin (``eager.py``)."""
