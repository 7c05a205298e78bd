"""FlashAttention's page-table metadata: its specs (``spec.py``: FlashAttention, TRT-LLM MHA's layout, the
EAGLE drafter's) and their eager twins (``eager.py``)."""
