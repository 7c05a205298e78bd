"""FlashMLA (SGLang's ``flashmla``, Hopper's MLA decode kernel): its spec, its tile scheduler as a kernel
recorded with the metadata (``planner.py``) and its eager twin."""
