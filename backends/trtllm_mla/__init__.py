"""TRT-LLM MLA (and CuTe-DSL MLA, the same metadata): its spec (``spec.py``) and its eager twin (``eager.py``)."""
