"""FlashInfer MLA (SGLang's ``flashinfer`` on an MLA model): its spec, FlashInfer's MLA wrapper as its planner
(``planner.py``), the MLA partition planned on the GPU (``device_plan.py``) and its eager twin."""
