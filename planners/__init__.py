"""attnmeta.planners: host planners that ``host_call`` nodes dispatch to, between the runtime core
and the backend specs. A planner is called ``planner(site, *host_inputs)`` (``runtime.planning.Site``:
the fields it plans into, a hook list for device work recorded with the metadata, a state dict of
its own); ``reference`` holds the stand-ins specs declare, ``flashinfer`` FlashInfer's graph-mode
wrappers and ``flashinfer_plan`` their split-KV partition planned on the GPU."""
