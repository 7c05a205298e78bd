"""FlashInfer (SGLang's ``flashinfer``): its spec (``spec.py``), FlashInfer's graph-mode wrappers as its planner
(``planner.py``), the split-KV partition planned on the GPU (``device_plan.py``) and its eager twin (``eager.py``)."""
